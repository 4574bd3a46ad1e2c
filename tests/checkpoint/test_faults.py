"""Issue 7, end to end with real processes: nothing lost, nothing hung, nothing left behind.

* a rank SIGKILLed mid-training is restarted by ``ringtrain run --max-restarts`` and the
  job ends exactly where an uninterrupted run ends, every sample trained on as often;
* a process killed at any point of writing a checkpoint leaves the previous one loadable;
* exact (evaluation) loaders with different numbers of batches per rank do not hang;
* 50 start/stop cycles of a 2-rank group leak no process, port or file descriptor;
* a restart with a different world size trains every sample of the epoch exactly once.

Jobs live in _fault_jobs.py. Launcher-level failures (a peer stuck in a collective, a
killed launcher, what a job listens on, elastic ranges) are in tests/launcher/test_launch_faults.py.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time

import _fault_jobs as jobs
import pytest
import torch

import _ring_jobs
from _launch_util import child_env, outputs, results

from ringtrain.checkpoint import files as checkpoint
from ringtrain.checkpoint.model import load_model_state
from ringtrain.checkpoint.folder import CheckpointDir

JOBS = jobs.__file__


# --- restart and resume ---------------------------------------------------------------

def _train(folder, **fault: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``ringtrain run --nproc-per-node 2 --max-restarts 1 _fault_jobs.py train`` into ``folder``."""
    return jobs.run_train(folder, **fault)


def _logs(paths) -> list[list[dict]]:
    return [jobs.StepLog.read(str(paths["log"] / f"rank{rank}.jsonl")) for rank in (0, 1)]


def _per_epoch(logs) -> dict[int, list[int]]:
    seen = collections.defaultdict(list)
    for log in logs:
        for row in log:
            seen[row["epoch"]] += row["idx"]
    return {epoch: sorted(idx) for epoch, idx in seen.items()}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["signal", "raise"])
def test_rank_killed_at_step_k_restarts_and_ends_as_if_never_killed(tmp_path, how):
    # 40 samples, 2 ranks x batch 4: 5 steps per epoch, 3 epochs = 15 steps. Checkpoints
    # every 3 steps; rank 1 SIGKILLs itself after step 8, so the newest complete checkpoint
    # is step 6 (epoch 1 after its first batch): a mid-epoch resume, steps 7-8 done again.
    clean, clean_paths = _train(tmp_path / "clean")
    assert clean.returncode == 0, outputs(clean)
    assert "ringtrain: resumed from" not in clean.stdout
    assert [r["attempt"] for r in results(clean.stdout)] == ["0", "0"], outputs(clean)

    marker = tmp_path / "killed-once"
    # "raise": a Python exception on rank 1. Rank 0, waiting in its next collective, is stopped
    # within seconds (not at the 30-minute collective timeout), so the restart comes promptly.
    started = time.monotonic()
    crashed, paths = _train(tmp_path / "crashed", RINGTRAIN_TEST_KILL_AT_STEP="8", RINGTRAIN_TEST_KILL_HOW=how,
                            RINGTRAIN_TEST_KILL_RANK="1", RINGTRAIN_TEST_KILL_MARKER=str(marker))
    assert time.monotonic() - started < 120, outputs(crashed)
    assert crashed.returncode == 0, outputs(crashed)
    assert marker.exists()  # the fault did fire
    # torchrun restarted both workers once, and the ring resumed from step 6, mid-epoch 1.
    assert [(r["rank"], r["attempt"], r["steps"]) for r in results(crashed.stdout)] == [
        ("0", "1", "15"), ("1", "1", "15")], outputs(crashed)
    resumed = [line for line in crashed.stdout.splitlines() if line.startswith("ringtrain: resumed from")]
    assert resumed == [f"ringtrain: resumed from {paths['ckpt'] / 'step-000000006.pt'} (epoch 1, step 6)"], outputs(crashed)

    # Identical parameters (dropout included: each rank's RNG was restored too).
    clean_params, params = torch.load(clean_paths["out"]), torch.load(paths["out"])
    assert (params - clean_params).abs().max().item() <= 1e-6

    # The logs hold the steps the final parameters saw: 1-6 from the first attempt, 7-15
    # from the restart, each step on the same samples as in the uninterrupted run.
    clean_logs, logs = _logs(clean_paths), _logs(paths)
    for rank in (0, 1):
        assert [row["step"] for row in logs[rank]] == list(range(1, 16))
        assert [row["attempt"] for row in logs[rank]] == [0] * 6 + [1] * 9
        strip = [{k: v for k, v in row.items() if k != "attempt"} for row in logs[rank]]
        assert strip == [{k: v for k, v in row.items() if k != "attempt"} for row in clean_logs[rank]]
    # Every sample of every epoch exactly as often as uninterrupted: here, once per epoch.
    assert _per_epoch(logs) == _per_epoch(clean_logs) == {epoch: list(range(40)) for epoch in range(3)}
    manifest = json.loads((paths["ckpt"] / "manifest.json").read_text())
    assert [entry["step"] for entry in manifest["checkpoints"]] == [12, 15]  # keep_last=2


# --- dying while a checkpoint is written ---------------------------------------------------

@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> torch.Tensor:
    return jobs.checkpointed_run(str(tmp_path_factory.mktemp("uninterrupted")))


# point -> (keep_last, the newest complete checkpoint after the kill, leftovers the kill leaves)
KILL_POINTS = {
    "temp-partial": (2, 2, "half-written temporary file"),
    "temp-complete": (2, 2, "complete temporary file, never renamed"),
    "renamed": (2, 2, "step-000000004.pt in place, not in the manifest"),
    "manifest-temp": (2, 2, "new manifest written to a temporary file, never renamed"),
    "pruning": (1, 4, "manifest updated, the dropped step-000000002.pt not yet deleted"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_killed_while_writing_a_checkpoint_leaves_a_loadable_one(tmp_path, point, uninterrupted):
    keep_last, newest, _what = KILL_POINTS[point]
    folder = tmp_path / "ckpt"
    # The checkpoint of step 2 is committed; the process dies while writing step 4's.
    proc = subprocess.run([sys.executable, JOBS, "ckpt-kill", "--folder", str(folder), "--point", point,
                           "--keep-last", str(keep_last)],
                          capture_output=True, text=True, timeout=90, env=child_env())
    assert proc.returncode == -9, outputs(proc)  # SIGKILL, at the chosen point
    names = sorted(os.listdir(folder))
    if point.startswith("temp"):
        assert any(n.startswith(".step-000000004.pt.") and n.endswith(".tmp") for n in names), names
    if point == "manifest-temp":
        assert any(n.startswith(".manifest.json.") for n in names), names
    if point in ("renamed", "pruning"):
        assert {"step-000000002.pt", "step-000000004.pt"} <= set(names), names

    latest = CheckpointDir(folder).latest()
    assert latest == str(folder / f"step-{newest:09d}.pt")
    saved = checkpoint.read(latest, torch.device("cpu"))  # whole, and loadable with weights_only
    assert saved[checkpoint.META_KEY]["optimizer_steps"] == newest
    load_model_state(jobs.dropout_model(), saved["model"], latest)

    # Starting again resumes from it and ends exactly as the run that never died.
    params = jobs.checkpointed_run(str(folder), keep_last=keep_last)
    assert (params - uninterrupted).abs().max().item() <= 1e-6
    assert not [n for n in os.listdir(folder) if n.endswith(".tmp")]
    for entry in json.loads((folder / "manifest.json").read_text())["checkpoints"]:
        checkpoint.read(str(folder / entry["file"]), torch.device("cpu"))


# --- uneven exact loaders, world-size change ------------------------------------------------

@pytest.mark.timeout(120)
def test_exact_loader_with_uneven_batches_per_rank_does_not_hang(run_ranks):
    # 5 samples, batch 2, 2 ranks: rank 0 gets samples 0-2 (2 batches), rank 1 samples 3-4
    # (1 batch). Each rank evaluates its share with the DDP model, then gathers.
    start = time.monotonic()
    r0, r1 = run_ranks(jobs.exact_uneven, 5, 2, timeout=90)
    assert time.monotonic() - start < 60
    assert (r0["batches"], r1["batches"]) == (2, 1)
    for r in (r0, r1):
        assert r["index"].tolist() == [0, 1, 2, 3, 4]  # each sample once, in dataset order
        assert torch.allclose(r["output"], r["expected"], atol=1e-6)


@pytest.mark.timeout(180)
def test_resume_with_fewer_ranks_trains_every_sample_of_the_epoch_once(run_ranks, tmp_path):
    # 2 ranks, 40 samples, batch 4: 5 steps per epoch, checkpoints every 2 steps; stop after
    # step 7, so the newest checkpoint is step 6 = epoch 1 after one batch per rank
    # (8 samples done). Resume on 1 rank and finish the epochs.
    folder = str(tmp_path / "ckpt")
    (_, seen0), (_, seen1) = run_ranks(_ring_jobs.periodic, folder, 3, 7, timeout=120)
    first = [s for s in seen0[: 6 * 4] + seen1[: 6 * 4] if s[0] == 1]
    _, second = _ring_jobs.periodic(folder, 3)  # this process: world size 1
    epoch1 = collections.Counter(i for _, i in first + [s for s in second if s[0] == 1])
    assert sorted(epoch1) == list(range(40))  # nothing skipped
    assert [i for i, times in epoch1.items() if times > 1] == []  # nothing repeated


# --- soak ---------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_fifty_start_stop_cycles_leak_no_process_port_or_descriptor(tmp_path):
    marker = f"ringtrain-soak-{time.time_ns()}"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, JOBS, "soak", "--cycles", "50"], capture_output=True, text=True,
                          timeout=240, env=child_env(RINGTRAIN_TEST_SOAK=marker), cwd=tmp_path)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, outputs(proc)
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("SOAK ")]
    soak = json.loads(line[5:])
    assert soak["cycles"] == 50
    assert len(soak["probe"]) == 1 and soak["probe"][0].startswith("127.0.0.1:")  # the accounting works
    # After the warm-up cycle the driver has its forkserver (and maybe multiprocessing's
    # resource tracker); 50 cycles later exactly the same processes, listening sockets
    # (none) and file descriptors.
    assert soak["after"]["children"] == soak["before"]["children"], soak
    assert soak["after"]["listening"] == soak["before"]["listening"] == [], soak
    assert soak["after"]["fds"] == soak["before"]["fds"], soak
    assert elapsed < 180, f"{elapsed:.0f} s"
    # Nothing started by the driver outlives it.
    leftovers = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    leftovers.append(pid)
        except OSError:
            pass
    assert leftovers == []
