"""Deaths told across machines (launcher/exits.py).

End to end: rank 0's worker is SIGKILLed (what the OOM killer does) on node 0 while node 1 runs in a
pid namespace of its own, as a second machine does (it cannot see node 0's pids). Node 0's agent posts
the death on the board; rank 1 learns it and blames rank 0, and so does the report on both nodes — also
under --max-restarts, where the attempt that ends the job has a store of its own."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from _launch_util import child_env, free_port, ringtrain_cmd, write  # noqa: E402

pytestmark = pytest.mark.timeout(180)

JOB = """
    import os, sys, time
    import torch
    import ringtrain as rt

    ring = rt.Ring(strategy="ddp")
    rank = int(os.environ["RANK"])
    out = sys.argv[1]
    name = f"pid.{os.environ['TORCHELASTIC_RESTART_COUNT']}.{rank}"  # one per attempt under --max-restarts
    with open(os.path.join(out, name + ".tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
    if rank == 0:
        time.sleep(150)  # killed by the test before this ends
    ring.all_reduce(torch.ones(1))  # rank 1 waits here for rank 0, which never comes
    print("NOT STOPPED", flush=True)
"""


def _unshare_works() -> str | None:
    """Why a pid namespace of its own cannot be had here (None: it can)."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    try:
        probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare failed: {e}"
    return None if probe.returncode == 0 else f"unshare --pid needs privileges here: {probe.stderr.decode().strip()}"


def _wait_for(path: Path, procs: list, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            pytest.fail(f"{path.name} never appeared; outputs: {[p.communicate(timeout=30) for p in procs]}")
        time.sleep(0.1)
    return int(path.read_text())


def _two_nodes(tmp_path: Path, *options: str, node0_output: bool = True) -> tuple[subprocess.Popen, ...]:
    """Node 0 here and node 1 in a pid namespace of its own, running JOB: both processes, then the port."""
    why = _unshare_works()
    if why:
        pytest.skip(why)
    script = write(tmp_path / "job.py", JOB)
    port = str(free_port())
    common = ["run", "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
              "--master-port", port, "--timeout", "60", *options]
    # Both nodes share one secret, as the user sets it on every machine (docs/security.md).
    env = child_env(RINGTRAIN_JOB_SECRET="test-secret-shared-by-both-nodes", RINGTRAIN_STALL_WARNING="off")
    output = subprocess.PIPE if node0_output else subprocess.DEVNULL
    node0 = subprocess.Popen(ringtrain_cmd(*common, "--node-rank", "0", str(script), str(tmp_path)),
                             stdout=output, stderr=output, text=True, env=env)
    node1 = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc",
                              *ringtrain_cmd(*common, "--node-rank", "1", str(script), str(tmp_path))],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return node0, node1, port


@pytest.mark.parametrize("restarts", [0, 1], ids=["no-restarts", "max-restarts-1"])
def test_a_rank_killed_on_another_node_is_named_on_every_node(tmp_path, restarts):
    node0, node1, _ = _two_nodes(tmp_path, "--max-restarts", str(restarts))
    procs = [node0, node1]
    try:
        # Under --max-restarts 1 rank 0 is killed in both attempts: the second time ends the job, and its
        # store is the restart's own (rendezvous.py), not the one on --master-port.
        for attempt in range(restarts + 1):
            victim = _wait_for(tmp_path / f"pid.{attempt}.0", procs)
            _wait_for(tmp_path / f"pid.{attempt}.1", procs)
            os.kill(victim, signal.SIGKILL)
        out0, err0 = node0.communicate(timeout=90)
        out1, err1 = node1.communicate(timeout=90)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    said = f"--- node 0\n{err0}\n--- node 1\n{err1}"
    assert node0.returncode == 1 and node1.returncode == 1, said
    assert "NOT STOPPED" not in out0 + out1
    # Rank 1 says who, and so does node 1's report; nothing blames rank 1 itself.
    blame = "rank 0 was killed by SIGKILL (the OOM killer?) on host "
    final = err1[err1.rfind("rank 1 stopped because"):]  # the last attempt's words
    assert "rank 1 stopped because" in err1 and blame in final, said
    assert f"ringtrain run: {blame}" in err1 and "worker rank 1 failed first" not in err1, said
    # Node 0's report names its own worker, killed by SIGKILL.
    assert "worker rank 0 failed first" in err0 and "SIGKILL" in err0, said


def test_a_node_lost_whole_is_named_by_its_store_in_a_second_and_one_warning(tmp_path):
    # Node 0's `ringtrain run` is SIGKILLed (the machine crashed, or lost its network): its worker goes with it
    # (no agent is left to post anything), and so does the store it hosts. Rank 1, in its own pid namespace,
    # blamed itself after ~6 s and ~100 C++ store warnings (1,500 lines of C++ stack) before.
    node0, node1, port = _two_nodes(tmp_path, node0_output=False)
    procs = [node0, node1]
    try:
        _wait_for(tmp_path / "pid.0.0", procs)
        _wait_for(tmp_path / "pid.0.1", procs)
        time.sleep(1)  # rank 1 is in its all_reduce
        os.kill(node0.pid, signal.SIGKILL)
        killed = time.monotonic()
        out1, err1 = node1.communicate(timeout=90)
        took = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert node1.returncode == 1 and "NOT STOPPED" not in out1, err1
    store = f"the job's store at 127.0.0.1:{port} closed its connections together with a peer"
    assert f"rank 1 stopped because {store}" in err1 and f"ringtrain run: {store}" in err1, err1
    assert "worker rank 1 failed first" not in err1 and "look at node 0" in err1, err1
    assert err1.count("TCPStore.cpp") <= 2, err1  # the board stops asking a store that is gone
    assert took < 20, f"{took:.1f} s"  # 0.7 s on an idle machine


def test_the_agent_posts_only_the_exits_nobody_posted(tmp_path):
    import json

    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from ringtrain.launcher import exits
    from ringtrain.liveness.board import Board
    from ringtrain.liveness.seal import Seal

    spoke = tmp_path / "error-2.json"  # rank 2 raised: ringtrain's worker wrote its post in its error file
    spoke.write_text(json.dumps({"message": {"message": "ValueError: x", "extraInfo": {
        "py_callstack": "", "timestamp": "1", "ringtrain": {"rank": 2, "state": "failed", "cause": "own"}}}}))
    failures = {
        0: ProcessFailure(local_rank=0, pid=100, exitcode=-9, error_file=str(tmp_path / "none-0")),   # OOM-killed
        1: ProcessFailure(local_rank=1, pid=101, exitcode=-15, error_file=str(tmp_path / "none-1")),  # the agent's stop
        2: ProcessFailure(local_rank=2, pid=102, exitcode=1, error_file=str(spoke)),
        3: ProcessFailure(local_rank=3, pid=103, exitcode=7, error_file=str(tmp_path / "none-3")),    # os._exit(7)
    }
    silent = exits.unspoken(failures, cause=0)
    assert [(e.rank, e.exitcode) for e in silent] == [(0, -9), (3, 7)]
    assert [e.rank for e in exits.unspoken(failures, cause=1)] == [0, 1, 3]  # a SIGTERM that was the cause

    store = dist.HashStore()
    board = Board(store, -1, 4, "0-0", Seal("k"))
    Board(store, 3, 4, "0-0", Seal("k")).post("failed", "it said so itself after all")
    posts = exits.tell_job(board, silent)
    assert [p.rank for p in posts] == [0]  # rank 3's own post is kept
    assert board.read()[0].as_blame().describe().startswith("rank 0 was killed by SIGKILL (the OOM killer?) on host ")
    exits.hold_store(board, local_ranks={0, 1, 2, 3}, wait_s=30)  # every rank is this node's: nothing to wait for


def test_a_sigterm_the_agent_did_not_send_is_the_cause(tmp_path):
    """Issue 37, item 5: rank 1 got a SIGTERM from outside (kill PID); the agent then stopped rank 0 with its own.
    Both died of SIGTERM without a word, and which the agent reaped first is a race: the agent's notes say which
    SIGTERM was its own, so rank 1 is the cause, posted for the other nodes, in every run."""
    import types

    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from ringtrain.launcher import exits, report

    failures = {r: ProcessFailure(local_rank=r, pid=200 + r, exitcode=-15, error_file=str(tmp_path / f"none-{r}"))
                for r in (0, 1)}
    stops = exits.Stops(grace=30)
    stops.sent[200] = ["SIGTERM"]  # the agent's own, to rank 0
    assert report.first_cause(failures, stops)[0] == 1
    assert report.first_cause(failures)[0] == 0  # without the notes: the lowest rank (the race, before)
    silent = exits.unspoken(failures, cause=1, stops=stops)
    assert [e.rank for e in silent] == [1]
    assert silent[0].as_blame().describe().startswith(
        "rank 1 was stopped by SIGTERM (sent to it, not to the launcher) on host ")
    said = report.format_child_failure(types.SimpleNamespace(failures=failures), 0, None, stops)
    assert said.startswith("ringtrain run: rank 1 was stopped by SIGTERM (sent to it, not to the launcher: local "
                           "rank 1 on node 0"), said
    assert "rank 0 (stopped by this launcher after rank 1 ended: SIGTERM)" in said and "failed first" not in said


def test_the_agent_notes_the_signals_it_sends_its_workers():
    import sys

    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    from ringtrain.launcher import exits

    stops, original = exits.Stops(), SubprocessHandler.close
    restore = stops.watch()
    try:
        handler = SubprocessHandler(sys.executable, ("-c", "import time; time.sleep(30)"), {}, None, None,
                                    local_rank_id=0, numa_options=None)
        handler.close()
        assert handler.proc.wait(timeout=30) == -15
    finally:
        restore()
    assert stops.sent == {handler.proc.pid: ["SIGTERM"]} and stops.by_agent(handler.proc.pid)
    assert not stops.killed_after_grace(handler.proc.pid)
    assert SubprocessHandler.close is original and not stops.by_agent(handler.proc.pid + 1)  # put back
