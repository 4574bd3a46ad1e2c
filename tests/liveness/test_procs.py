"""liveness/procs.py: one answer to "is this process alive", for the lock, temporaries and the board."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

from ringtrain.checkpoint import temporaries
from ringtrain.liveness import procs


def _ended_child() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_this_process_is_alive_and_an_ended_one_is_gone():
    me = procs.ProcessId.me()
    assert me.pid == os.getpid() and me.start and me.boot and me.pidns
    assert me.status() == "alive"
    assert replace(me, pid=_ended_child()).status() == "gone"


def test_a_reused_pid_is_another_process():
    parent = procs.ProcessId.me()
    assert replace(parent, pid=os.getppid(), start="1").status() == "gone"  # alive, but started at another time
    assert replace(parent, pid=os.getppid(), start=procs.start_ticks(os.getppid())).status() == "alive"


def test_another_host_boot_or_pid_namespace():
    me = procs.ProcessId.me()
    assert replace(me, host="another-node").status() == "elsewhere"
    assert replace(me, boot="an-earlier-boot").status() == "rebooted"
    assert replace(me, pidns="4026531999").status() == "elsewhere"  # its pid names another process here, or none
    assert replace(me, boot="", pidns="").status() == "alive"  # unknown parts (an older record) are not compared


def test_a_zombie_has_ended():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while procs.state(child.pid) != "a zombie":  # exited, not reaped yet
            pass
        assert procs.exists(child.pid) and procs.ended(child.pid)
        assert replace(procs.ProcessId.me(), pid=child.pid, start=procs.start_ticks(child.pid)).status() == "gone"
    finally:
        child.wait()
    assert not procs.exists(child.pid) and procs.ended(child.pid) and procs.state(child.pid) == "gone"


def test_the_host_identity_holds_the_pid_namespace():
    assert procs.host_identity().endswith("/" + procs.pid_namespace())
    assert len(procs.host_hash()) == 8


def test_a_temporary_from_another_pid_namespace_is_never_taken_for_a_dead_writers(tmp_path):
    """The writer tag's host hash covers the pid namespace: a tag from another namespace is another host's."""
    dead = _ended_child()
    assert temporaries.writer_gone(f"{procs.host_hash()}-{dead}")
    assert not temporaries.writer_gone(f"{procs.host_hash()}-{os.getpid()}")
    assert not temporaries.writer_gone(f"0badcafe-{dead}")  # another host or pid namespace: cannot tell
