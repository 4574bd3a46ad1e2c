"""Elastic scale-up: a node that joins a running `ringtrain run --nnodes 1:2` job is admitted, never left hanging.

torch's elastic agent was seen to hang for 40+ s in "Rendezvous'ing worker group" when a second
node joined a running 1:2 job (pytorch/pytorch#123678). Here two agents run on this machine
(127.0.0.1): node A starts alone and trains at world size 1 until its step 6, then blocks, so
the only way on is the group re-forming with node B. B joins; A's agent sees a node waiting,
stops its workers, and both re-form at world size 2; the workers resume from the newest
checkpoint (Ring(checkpoint_dir=...)) and finish. The test waits for events (log lines, exits),
not for time; the time B took to be admitted is printed (pytest -s), not asserted.

A third node joining a job that has its MAX nodes waits as a spare (torch keeps it, past
--timeout, until a node leaves): it says so, and when the job ends without it, it ends with the
reason (stress: three agents).
"""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _launch_util import child_env, free_port, ringtrain_cmd

JOB = Path(__file__).resolve().parents[1] / "helpers" / "_elastic_job.py"
STOP = 6  # _elastic_job.STOP


def _rows(log: Path) -> list:
    return [json.loads(line) for f in sorted(log.glob("*.jsonl")) for line in f.read_text().splitlines() if line]


@pytest.mark.timeout(300)
def test_a_node_joining_mid_run_is_admitted_and_the_group_resumes_from_the_checkpoint(tmp_path):
    ckpt, log = tmp_path / "ckpt", tmp_path / "log"
    log.mkdir()
    # --timeout 30: a joining node has 30 s to be admitted; the first round waits 15 s for more nodes.
    command = ringtrain_cmd("run", "--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "3",
                            "--master-port", str(free_port()), "--timeout", "30", str(JOB), str(ckpt), str(log))
    env = child_env()
    a = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    b = None
    try:
        deadline = time.monotonic() + 150
        while not any(r["world"] == 1 and r["step"] == STOP for r in _rows(log)):  # A alone, blocked at STOP
            assert a.poll() is None and time.monotonic() < deadline, a.communicate(timeout=10)
            time.sleep(0.2)
        joined = time.time()
        b = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             cwd=tmp_path)
        out_b, err_b = b.communicate(timeout=200)
        out_a, err_a = a.communicate(timeout=60)
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    report = f"--- A ({a.returncode})\n{out_a}\n{err_a}\n--- B ({b.returncode})\n{out_b}\n{err_b}"
    assert (a.returncode, b.returncode) == (0, 0), report
    # A waited for more nodes before it started alone, and said so.
    assert "waiting for the nodes of the elastic job (--nnodes 1:2" in err_a, report
    rows = _rows(log)
    alone = [r for r in rows if r["world"] == 1]
    together = [r for r in rows if r["world"] == 2]
    resumed = sorted({int(m) for m in re.findall(r"resumed from \S*step-0*(\d+)\.pt", out_a + err_a + out_b + err_b)})
    assert resumed and resumed[-1] <= STOP and resumed[-1] % 2 == 0, report  # the newest checkpoint A wrote
    start = resumed[-1]
    assert min(r["step"] for r in together) == start + 1, report  # exactly where the checkpoint left off
    # Epoch 0: the samples trained alone up to the checkpoint, and those trained together after it, are
    # the whole dataset, each once (resharded from 1 rank to 2: resume.py).
    seen = [i for r in alone if r["step"] <= start for i in r["idx"]]
    seen += [i for r in together if r["epoch"] == 0 for i in r["idx"]]
    counts = collections.Counter(seen)
    assert sorted(counts) == list(range(64)) and set(counts.values()) == {1}, report
    # Both ranks finish the two epochs: the checkpoint's steps, the rest of epoch 0 and all of epoch 1 at 4 a step.
    steps = str(start + (64 - 2 * start) // 4 + 64 // 4)
    results = sorted(re.findall(r"RESULT rank=(\d) world=(\d) steps=(\d+)", out_a + out_b))
    assert results == [("0", "2", steps), ("1", "2", steps)], report
    admitted = min(r["t"] for r in together) - joined
    sys.stdout.write(f"\nnode B admitted: its first step at world size 2 came {admitted:.1f} s after it was started\n")


# Up at world size 2, then wait for the test's signal (a file) before leaving together.
HOLDING = r"""
import os, sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
sys.stdout.write(f"UP rank={dist.get_rank()} world={dist.get_world_size()}\n")
sys.stdout.flush()
while not os.path.exists(sys.argv[1]):  # the test creates it once the spare has spoken
    time.sleep(0.2)
dist.barrier()
dist.destroy_process_group()
"""


class _Lines:
    """Every line a process writes on stdout and stderr, collected as it comes (the pipes never fill)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.text, self._lock = proc, [], threading.Lock()
        for pipe in (proc.stdout, proc.stderr):
            threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe) -> None:
        for line in pipe:
            with self._lock:
                self.text.append(line)

    def all(self) -> str:
        with self._lock:
            return "".join(self.text)


def _until(condition, limit: float, what: str, *procs: _Lines) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline or any(p.proc.poll() is not None for p in procs):
            raise AssertionError(f"never: {what}\n" + "\n".join(f"--- {p.proc.args}\n{p.all()}" for p in procs))
        time.sleep(0.2)


@pytest.mark.stress
@pytest.mark.timeout(400)
def test_a_node_beyond_max_waits_as_a_spare_says_so_and_ends_with_a_reason_when_the_job_ends(tmp_path):
    script = tmp_path / "holding.py"
    script.write_text(HOLDING)
    go = tmp_path / "go"
    command = ringtrain_cmd("run", "--nnodes", "1:2", "--nproc-per-node", "1", "--master-port", str(free_port()),
                            "--timeout", "10", str(script), str(go))
    env = child_env()

    def start() -> _Lines:
        return _Lines(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                       cwd=tmp_path))

    nodes = [start(), start()]
    try:
        _until(lambda: "".join(n.all() for n in nodes).count("world=2") == 2, 150, "two ranks at world size 2",
               *nodes)
        spare = start()
        _until(lambda: "waits as a spare" in spare.all(), 150, "the spare says it waits", spare, *nodes)
        go.touch()
        codes = [n.proc.wait(timeout=120) for n in (*nodes, spare)]
    finally:
        for n in nodes + ([spare] if "spare" in locals() else []):
            if n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait()
    said = spare.all()
    report = "\n".join(f"--- exit {c}\n{n.all()}" for c, n in zip(codes, (*nodes, spare)))
    assert codes == [0, 0, 1], report
    assert "the elastic job already has its 2 nodes (--nnodes 1:2), so this node waits as a spare" in said, report
    assert "ended (or stopped taking nodes) before this node could join it" in said and "HINT:" in said, report
    assert "Traceback" not in said and "is_failed" not in said, report
