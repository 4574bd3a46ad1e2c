"""failures.py: what a failed rank leaves behind, and that it leaves no processes behind.

Real processes in real process groups; nothing is mocked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ringtrain.liveness import failures

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# A group leader that starts a sleeping child, prints the child's pid, then does what argv[1] says.
LEADER = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
if sys.argv[1] == "stop-own":
    from ringtrain.liveness import failures
    from ringtrain.parallel import contract  # TORCHELASTIC_RUN_ID: started by torchrun's agent
    print(sorted(failures.stop_own_processes(contract.read().run_id is not None)), flush=True)
    child.wait(timeout=20)
    print("child ended", child.returncode, flush=True)
else:
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _leader(mode: str, env: dict, new_session: bool = True) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", LEADER, mode], stdout=subprocess.PIPE, text=True,
                            env=env, start_new_session=new_session)


@pytest.mark.timeout(60)
def test_a_failing_torchrun_worker_stops_what_it_started_and_not_itself():
    proc = _leader("stop-own", {**os.environ, "TORCHELASTIC_RUN_ID": "t"})
    child = int(proc.stdout.readline())
    assert proc.stdout.readline().strip() == f"[{child}]"  # exactly its child, not itself
    assert proc.stdout.readline().strip() == f"child ended {-signal.SIGTERM}"
    assert proc.wait(timeout=20) == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env, new_session", [({}, True), ({"TORCHELASTIC_RUN_ID": "t"}, False)],
                         ids=["not-started-by-torchrun", "not-a-group-leader"])
def test_anything_else_keeps_its_processes(env, new_session):
    # `python train.py | tee log` in a shell: the script leads a group that holds the user's tee.
    clean = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RUN_ID"}
    proc = subprocess.Popen([sys.executable, "-c", LEADER.replace("child.wait(timeout=20)", "time.sleep(1)"),
                             "stop-own"], stdout=subprocess.PIPE, text=True, env={**clean, **env},
                            start_new_session=new_session)
    try:
        child = int(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "[]"
        assert _alive(child)
    finally:
        os.kill(child, signal.SIGKILL)
        proc.wait(timeout=20)


@pytest.mark.timeout(60)
def test_the_launcher_stops_the_group_of_a_worker_killed_by_a_signal():
    proc = _leader("sigkill", dict(os.environ))
    child = int(proc.stdout.readline())
    assert proc.wait(timeout=20) == -signal.SIGKILL
    assert _alive(child)  # orphaned, in the dead leader's group
    assert failures.stop_leftover_groups([proc.pid]) == [proc.pid]
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, "the orphan outlived its group's stop"
        time.sleep(0.05)


def test_a_live_process_or_an_empty_group_is_left_alone():
    assert failures.stop_leftover_groups([os.getpid()]) == []  # alive: the agent's own stop covers it
    done = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    assert done.wait(timeout=20) == 0
    assert failures.stop_leftover_groups([done.pid]) == []  # its group ended with it: nothing to stop
    assert failures.stop_leftover_groups([0, None, -1]) == []
