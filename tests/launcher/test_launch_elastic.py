"""Elastic scale-up: a node that joins a running `ringtrain run --nnodes 1:2` job is admitted, never left hanging.

torch's elastic agent was seen to hang for 40+ s in "Rendezvous'ing worker group" when a second
node joined a running 1:2 job (pytorch/pytorch#123678). Here two agents run on this machine
(127.0.0.1): node A starts alone and trains at world size 1 until its step 6, then blocks, so
the only way on is the group re-forming with node B. B joins; A's agent sees a node waiting,
stops its workers, and both re-form at world size 2; the workers resume from the newest
checkpoint (Ring(checkpoint_dir=...)) and finish. The test waits for events (log lines, exits),
not for time; the time B took to be admitted is printed (pytest -s), not asserted.
"""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _launch_util import child_env, free_port, ringtrain_cmd

JOB = Path(__file__).with_name("_elastic_job.py")
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
