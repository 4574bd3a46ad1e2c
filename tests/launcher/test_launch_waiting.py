"""A node waiting for its peers says whom it waits for; a rendezvous that fails early says why.

Real launchers on loopback for what users see; real TCPStores in this process for the pieces.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from datetime import timedelta

import pytest
from _launch_util import ALLREDUCE, child_env, free_port, outputs, results, ringtrain_cmd, run_ringtrain, write
from torch.distributed import DistNetworkError, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousTimeoutError,
)

from ringtrain.launcher import waiting


def _reader(proc: subprocess.Popen) -> queue.Queue:
    """The lines of ``proc``'s stderr, as they come (read to the end, so the pipe never fills)."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _wait_for_line(lines: queue.Queue, text: str, limit: float) -> list:
    seen, deadline = [], time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"no line with {text!r} in:\n{''.join(seen)}")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("first", [0, 1], ids=["node-0-first", "node-1-first"])
def test_a_node_started_before_its_peer_says_whom_it_waits_for_and_then_joins(tmp_path, first):
    script = write(tmp_path / "train.py", ALLREDUCE)
    port = free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--master-port", str(port), "--timeout", "150"]

    def start(rank: int) -> subprocess.Popen:
        return subprocess.Popen(ringtrain_cmd("run", *common, "--node-rank", str(rank), str(script)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())

    said = (f"waiting for 1 of 2 nodes at 127.0.0.1:{port}, " if first == 0 else
            f"waiting for node 0 at 127.0.0.1:{port} to answer (connection refused), ")
    nodes = {first: start(first)}
    try:
        lines = _reader(nodes[first])
        # The line comes every 10 s; allow for a slow start of Python and torch on a loaded machine.
        seen = _wait_for_line(lines, said, limit=120)
        assert seen[-1].rstrip().endswith("s of --timeout 150"), seen
        nodes[1 - first] = start(1 - first)
        other_out, other_err = nodes[1 - first].communicate(timeout=120)
        first_out = nodes[first].stdout.read()
        nodes[first].wait(timeout=60)
    finally:
        for proc in nodes.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    report = f"first: {nodes[first].returncode}\n{first_out}\nother: {nodes[1 - first].returncode}\n{other_out}\n{other_err}"
    assert nodes[0].returncode == 0 and nodes[1].returncode == 0, report
    assert [(r["rank"], r["world"], r["sum"]) for r in results(first_out + other_out)] == [
        ("0", "2", "3.0"), ("1", "2", "3.0")], report


@pytest.mark.timeout(120)
def test_a_rendezvous_that_fails_early_says_what_happened_not_that_the_timeout_ran_out(tmp_path):
    script = write(tmp_path / "train.py", ALLREDUCE)
    start = time.monotonic()  # .invalid never resolves (RFC 2606)
    proc = run_ringtrain("run", "--nnodes", "2", "--node-rank", "1", "--master-addr", "node0.invalid",
                         "--timeout", "300", str(script), timeout=100)
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, outputs(proc)
    assert "the address does not resolve" in proc.stderr and "before --timeout (300 s) ran out" in proc.stderr, outputs(proc)
    assert "after --timeout" not in proc.stderr and "HINT:" in proc.stderr, outputs(proc)
    assert "Traceback" not in proc.stderr and "RESULT" not in proc.stdout, outputs(proc)
    assert elapsed < 300  # it did not wait out the timeout it no longer claims


def test_the_words_of_a_failure_follow_what_happened():
    common = {"node_rank": 1, "elastic": False, "nnodes": "2", "max_nodes": 2, "master_addr": "10.0.0.1",
              "port": 29500, "timeout": 300}
    timed_out = waiting.rendezvous_failure(**common, error=RendezvousTimeoutError("1 of 2 nodes joined"), seconds=300.2)
    assert str(timed_out).startswith("could not join the rendezvous at 10.0.0.1:29500 after --timeout 300 s")
    refused = waiting.rendezvous_failure(**common, error=DistNetworkError("connect() failed: Connection refused"),
                                         seconds=0.8)
    assert "failed 0.8 s after this node started, before --timeout (300 s) ran out" in str(refused)
    assert "nothing listens there (connection refused)" in str(refused) and "after --timeout" not in str(refused)
    late = waiting.rendezvous_failure(**common, error=DistNetworkError("Connection refused"), seconds=301.0)
    assert "failed 301.0 s after this node started: nothing listens" in str(late) and "before" not in str(late)
    taken = waiting.rendezvous_failure(**{**common, "node_rank": 0}, seconds=0.3,
                                       error=RuntimeError("bind: Address already in use"))
    assert "the port is already in use on this machine" in str(taken)
    assert refused.hint and taken.hint  # each ends with a HINT line
    ended = waiting.rendezvous_failure(**{**common, "elastic": True, "nnodes": "1:2"}, seconds=95.0,
                                       error=RendezvousClosedError("the elastic job ended while this node waited"))
    assert str(ended).startswith("the elastic job at 10.0.0.1:29500 ended (or stopped taking nodes) before this node")
    assert "takes at most MAX nodes (--nnodes 1:2)" in ended.hint and "after --timeout" not in str(ended)


def test_join_all_says_how_many_nodes_are_missing_and_names_them_at_the_timeout():
    server = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
    counter = TCPStore("127.0.0.1", server.port, None, False, timedelta(seconds=30), wait_for_workers=False)
    said: list = []
    with pytest.raises(RendezvousTimeoutError, match="1 of 3 nodes joined within --timeout 1.5 s"):
        waiting.join_all(server, counter, "job", 3, since=time.monotonic(), timeout=1.5, where="127.0.0.1:1",
                         every=0.4, out=said.append)
    assert said and all(line.startswith("waiting for 2 of 3 nodes at 127.0.0.1:1, ") for line in said), said
    # Once everyone has come, the last arrival releases the others at once.
    other = TCPStore("127.0.0.1", server.port, None, False, timedelta(seconds=30), wait_for_workers=False)
    done = threading.Thread(target=waiting.join_all, args=(other, counter, "job2", 2),
                            kwargs={"since": time.monotonic(), "timeout": 60, "where": "x", "out": said.append})
    done.start()
    waiting.join_all(server, counter, "job2", 2, since=time.monotonic(), timeout=60, where="x", out=said.append)
    done.join(timeout=30)
    assert not done.is_alive()


def test_reach_says_why_node_0_does_not_answer_and_fails_at_once_on_a_bad_name():
    said: list = []
    port = free_port()  # nobody listens there
    with pytest.raises(RendezvousTimeoutError, match=r"did not answer within --timeout 1.5 s \(connection refused\)"):
        waiting.reach("127.0.0.1", port, since=time.monotonic(), timeout=1.5, every=0.5, out=said.append)
    assert said and "to answer (connection refused)" in said[0], said
    start = time.monotonic()
    with pytest.raises(RendezvousConnectionError, match="cannot resolve 'node0.invalid'"):
        waiting.reach("node0.invalid", port, since=start, timeout=300)
