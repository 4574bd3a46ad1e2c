"""Issue 31, item 12: a daemon a rank starts (double fork, setsid) outlived the job silently, as under torchrun.
``ringtrain run`` adopts its workers' orphans (launcher/leftovers.py), names each one left at the end and stops it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from _launch_util import child_env, outputs, ringtrain_cmd, write

from ringtrain.liveness import procs

DAEMON = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1 and os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(sys.argv[1], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(300)
    os._exit(0)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux's")
def test_a_daemon_a_rank_started_is_named_and_stopped_when_the_job_ends(tmp_path):
    script = write(tmp_path / "job.py", DAEMON)
    pid_file = tmp_path / "daemon.pid"
    proc = subprocess.run(ringtrain_cmd("run", "--nproc-per-node", "2", str(script), str(pid_file)),
                          capture_output=True, text=True, timeout=90, env=child_env())
    assert proc.returncode == 0, outputs(proc)
    daemon = int(pid_file.read_text())
    assert f"ringtrain run: process {daemon} (" in proc.stderr and "was still running after the job" in proc.stderr, \
        outputs(proc)
    assert "HINT: a process that must outlive the job" in proc.stderr
    deadline = time.monotonic() + 5
    while procs.exists(daemon) and time.monotonic() < deadline:  # stopped and reaped before the launcher left
        time.sleep(0.1)
    assert not procs.exists(daemon), f"daemon {daemon} still runs"


def test_children_and_command_lines_come_from_proc():
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in procs.children(os.getpid())
        # Popen returns when exec closed its error pipe, which the kernel does before it fills the new
        # /proc/PID/cmdline: a moment of "" there is the kernel's, not ours (CI of stop 34 read it once)
        deadline = time.monotonic() + 5
        while procs.command_line(child.pid) == "" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert procs.command_line(child.pid) == "sleep 30"
    finally:
        child.kill()
        child.wait()
    assert child.pid not in procs.children(os.getpid())
