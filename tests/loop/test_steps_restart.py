"""Issue 30, "Done when": a step-based loop (its own get_batch, accumulation k = 2, an evaluation drawing random
batches every 4 steps, random draws right after each step, save_every=5) killed with SIGKILL at a random point
under ``--max-restarts 1`` ends bitwise equal to the uninterrupted run — for DDP and FSDP, and FSDP(tp=2) on 4 ranks
(tp2 x dp2, issue 39) — and equal to one process with the same global batch (to 1e-5). One kill point per strategy
here; ten each in ``make test-stress``."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import time

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


NPROCS = {"fsdp-tp2": 4}  # FSDP(tp=2): tp2 x dp2, each TP group reading one data rank's batches


class _Uninterrupted(dict):
    """Each strategy's uninterrupted run, made the first time a test asks for it."""

    def __init__(self, tmp_path_factory) -> None:
        super().__init__()
        self.factory = tmp_path_factory

    def __missing__(self, strategy: str) -> dict:
        self[strategy] = _run(self.factory.mktemp(strategy), "--strategy", strategy, nprocs=NPROCS.get(strategy, 2))
        return self[strategy]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return _Uninterrupted(tmp_path_factory)


def _differences(params: dict, evals: list, uninterrupted: dict, strategy: str, label: str) -> list[str]:
    """How a resumed run differs from the uninterrupted one: its final parameters (bitwise), and what each rank's
    loop did after its checkpoint, evaluation and random draws included (none: the empty list)."""
    found = [] if _same(params, uninterrupted[strategy]["params"]) else [f"{label}: params differ"]
    for rank in range(len(evals)):
        whole = uninterrupted[strategy]["evals"][rank]
        if evals[rank] != whole[len(whole) - len(evals[rank]):]:
            found.append(f"{label}, rank {rank}: evaluations differ")
    return found


def _killed_run(tmp_path, strategy: str, kill_at: int, uninterrupted) -> list[str]:
    """Rank 1 SIGKILLed at its ``kill_at``-th backward under --max-restarts 1: how the end differs (see above)."""
    got = _run(tmp_path, "--strategy", strategy, "--kill-at", str(kill_at), nprocs=NPROCS.get(strategy, 2))
    # The restart resumes from the newest checkpoint the manifest listed when rank 1 died — or a newer one that the
    # survivor committed after it: FSDP's are written in the background, and one whose shards were all written
    # before the kill may be listed after it (seen once in CI: none listed, resumed from step 5); rank 0 may also
    # still be saving the step rank 1 has gone past. Never an older one, and the end is bitwise equal either way.
    listed = json.loads((tmp_path / "at_kill.json").read_text())
    last = listed["checkpoints"][-1]["file"] if listed and listed.get("checkpoints") else None
    resumed_from = re.search(r"resumed from (\S+) ", got["proc"].stdout + got["proc"].stderr)
    label = f"kill at backward {kill_at}"
    found = _differences(got["params"], got["evals"], uninterrupted, strategy, label)
    if resumed_from is None and last is not None:
        found.append(f"{label}: started afresh, though {last} was listed\n{outputs(got['proc'])}")
    if resumed_from is not None and last is not None and os.path.relpath(resumed_from[1], tmp_path / "ckpt") < last:
        found.append(f"{label}: resumed from {resumed_from[1]}, older than {last}\n{outputs(got['proc'])}")
    return found


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp-tp2"])
def test_killed_at_a_random_point_ends_bitwise_equal(strategy, tmp_path, uninterrupted):
    found = _killed_run(tmp_path, strategy, random.Random(strategy).randint(11, BACKWARDS - 1), uninterrupted)
    assert found == [], "\n".join(found)


@pytest.mark.stress
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp-tp2"])
def test_ten_random_kill_points_each_end_bitwise_equal(strategy, tmp_path, uninterrupted):
    found = [d for kill_at in random.Random(f"ten-{strategy}").sample(range(2, BACKWARDS), 10)
             for d in _killed_run(tmp_path / f"kill{kill_at}", strategy, kill_at, uninterrupted)]
    assert found == [], "\n".join(found)


@pytest.mark.timeout(300)
def test_equal_to_one_process_with_the_same_global_batch(tmp_path, uninterrupted):
    one = _run(tmp_path, nprocs=1)
    for strategy in ("ddp", "fsdp", "fsdp-tp2"):
        diff = max((one["params"][k] - uninterrupted[strategy]["params"][k]).abs().max().item() for k in one["params"])
        assert diff <= 1e-5, (strategy, diff)


# --- Issue 32: preemption (loop/preempt.py) --------------------------------------------------------------------
def _preempted_run(out, strategy: str, at: int, how: str, uninterrupted, *flags: str, signal_name: str = "SIGTERM",
                   nodes: tuple = ("--nproc-per-node", "2")) -> tuple[list[str], float]:
    """A run signalled at rank 1's ``at``-th backward exits 75 with one checkpoint (save_every=1000: the
    preemption's), and the same command then resumes there. Returns how its end differs from the uninterrupted
    run's (``_differences``) and the seconds from the signal to the launcher's exit."""
    command = ringtrain_cmd("run", *nodes, *flags, JOB, "--out", str(out), "--strategy", strategy,
                            "--save-every", "1000", "--preempt-at", str(at), "--preempt-how", how,
                            "--preempt-signal", signal_name)
    first = subprocess.run(command, capture_output=True, text=True, timeout=240, env=child_env())
    ended = time.time()
    assert first.returncode == 75, outputs(first)
    assert "preempted" in first.stderr and "run the same command again" in first.stderr, outputs(first)
    saved = sorted(p.name for p in (out / "ckpt").iterdir() if p.name.startswith("step-"))
    assert len(saved) == 1, saved  # the preemption's checkpoint, no periodic one
    signalled, at_step = (out / "signalled").read_text().split()
    # Noted during rank 1's step s; the agreement issued at the top of s + 1 is read at the top of s + 2 — or
    # one step sooner, when a rank one step behind (up to one, the async agreement allows) took it in round s.
    assert int(saved[0].split("-")[1].split(".")[0]) in (int(at_step) + 1, int(at_step) + 2), (saved, at_step)
    second = subprocess.run(command, capture_output=True, text=True, timeout=240, env=child_env())
    assert second.returncode == 0, outputs(second)
    assert "resumed from" in second.stdout + second.stderr, outputs(second)
    evals = [json.loads((out / f"evals.rank{rank}.json").read_text()) for rank in range(2)]
    found = _differences(torch.load(out / "params.pt"), evals, uninterrupted, strategy,
                         f"preempted at backward {at} ({how})")
    return found, ended - float(signalled)


@pytest.mark.timeout(600)
def test_the_launchers_sigterm_preempts_at_a_step_and_the_same_command_resumes_bitwise(tmp_path, uninterrupted):
    found, _ = _preempted_run(tmp_path, "ddp", random.Random("preempt-ddp").randint(3, BACKWARDS - 6), "launcher",
                              uninterrupted)
    assert found == [], found


@pytest.mark.timeout(600)
def test_a_signal_to_one_rank_preempts_every_rank_at_the_same_step_fsdp(tmp_path, uninterrupted):
    # Only rank 1 gets the job's preemption signal (a scheduler's signals reach the ranks at different times):
    # the ranks agree, and every one saves the same step. (A SIGTERM to one worker alone under ringtrain run is
    # a stop, not a preemption: the agent was not signalled.)
    found, _ = _preempted_run(tmp_path, "fsdp", random.Random("preempt-fsdp").randint(3, BACKWARDS - 6), "rank1",
                              uninterrupted, "--preempt-signal", "USR1", signal_name="SIGUSR1")
    assert found == [], found


@pytest.mark.timeout(600)
def test_two_nodes_on_one_machine_are_preempted_together(tmp_path, uninterrupted):
    # -H localhost:1,127.0.0.1:1: two node agents under one ringtrain run. Rank 1's agent is signalled; the ranks
    # agree, both save, both agents exit 75, and so does the ringtrain run above them.
    found, _ = _preempted_run(tmp_path, "ddp", 7, "launcher", uninterrupted, nodes=("-H", "localhost:1,127.0.0.1:1"))
    assert found == [], found


@pytest.mark.timeout(600)
def test_preempt_signal_usr1_through_the_launcher(tmp_path, uninterrupted):
    found, _ = _preempted_run(tmp_path, "ddp", 9, "launcher", uninterrupted, "--preempt-signal", "USR1",
                              signal_name="SIGUSR1")
    assert found == [], found


@pytest.mark.stress
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_ten_random_preemption_points_each_resume_bitwise(strategy, tmp_path, uninterrupted):
    found, seconds = [], []
    for i, at in enumerate(random.Random(f"preempt-ten-{strategy}").sample(range(1, BACKWARDS - 3), 10)):
        if i % 2:
            differs, took = _preempted_run(tmp_path / f"at{at}", strategy, at, "rank1", uninterrupted,
                                           "--preempt-signal", "USR1", signal_name="SIGUSR1")
        else:
            differs, took = _preempted_run(tmp_path / f"at{at}", strategy, at, "launcher", uninterrupted)
        found += differs
        seconds.append(took)
    print(f"{strategy}: signal to the launcher's exit: {min(seconds):.2f}-{max(seconds):.2f} s "
          f"(mean {sum(seconds) / len(seconds):.2f} s) over {len(seconds)} preemptions")
    assert found == [], found
