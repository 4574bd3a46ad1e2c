"""Issue 30, "Done when": a step-based loop (its own get_batch, accumulation k = 2, an evaluation drawing random
batches every 4 steps, random draws right after each step, save_every=5) killed with SIGKILL at a random point
under ``--max-restarts 1`` ends bitwise equal to the uninterrupted run — for DDP and FSDP — and equal to one
process with the same global batch (to 1e-5). One kill point per strategy here; ten each in ``make test-stress``."""

from __future__ import annotations

import json
import os
import random
import subprocess

import pytest
import torch
from _launch_util import HELPERS, child_env, outputs, ringtrain_cmd

JOB = os.path.join(HELPERS, "_steps_jobs.py")
BACKWARDS = 2 * 12  # k x STEPS of _steps_jobs, per rank


def _run(out, *options: str, nprocs: int = 2) -> dict:
    command = (ringtrain_cmd("run", "--nproc-per-node", str(nprocs), "--max-restarts", "1", JOB, "--out", str(out),
                             *options))
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, env=child_env())
    assert proc.returncode == 0, outputs(proc)
    evals = [json.loads((out / f"evals.rank{r}.json").read_text()) for r in range(nprocs)]
    return {"params": torch.load(out / "params.pt"), "evals": evals, "proc": proc}


def _same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return {s: _run(tmp_path_factory.mktemp(s), "--strategy", s) for s in ("ddp", "fsdp")}


def _killed_run(tmp_path, strategy: str, kill_at: int, uninterrupted) -> None:
    got = _run(tmp_path, "--strategy", strategy, "--kill-at", str(kill_at))
    assert "resumed from" in got["proc"].stdout + got["proc"].stderr, outputs(got["proc"])
    assert _same(got["params"], uninterrupted[strategy]["params"]), f"kill at backward {kill_at}: params differ"
    for rank in range(2):  # what the resumed loop did after its checkpoint, evaluation and random draws included
        whole = uninterrupted[strategy]["evals"][rank]
        resumed = got["evals"][rank]
        assert resumed == whole[len(whole) - len(resumed):], f"kill at backward {kill_at}, rank {rank}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_killed_at_a_random_point_ends_bitwise_equal(strategy, tmp_path, uninterrupted):
    _killed_run(tmp_path, strategy, random.Random(strategy).randint(11, BACKWARDS - 1), uninterrupted)


@pytest.mark.stress
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_ten_random_kill_points_each_end_bitwise_equal(strategy, tmp_path, uninterrupted):
    for kill_at in random.Random(f"ten-{strategy}").sample(range(2, BACKWARDS), 10):
        _killed_run(tmp_path / f"kill{kill_at}", strategy, kill_at, uninterrupted)


@pytest.mark.timeout(300)
def test_equal_to_one_process_with_the_same_global_batch(tmp_path, uninterrupted):
    one = _run(tmp_path, nprocs=1)
    for strategy in ("ddp", "fsdp"):
        diff = max((one["params"][k] - uninterrupted[strategy]["params"][k]).abs().max().item() for k in one["params"])
        assert diff <= 1e-5, (strategy, diff)
