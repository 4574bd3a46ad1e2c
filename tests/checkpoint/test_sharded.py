"""Sharded checkpoints end to end (sharded.py, resume.py): FSDP's periodic saves are folders every rank writes
its part of, asynchronously; a kill -9 at any moment — mid-epoch, or while a save is being written — resumes
to the uninterrupted run's parameters; a restart at another world size trains every sample once.

The restart jobs are _fault_jobs.py's (the same job and checks as DDP's in test_faults.py), run with
``--strategy fsdp``. Folder-level checks (refusals, loads at any world size) are in strategies/test_fsdp.py.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess

import _fault_jobs as jobs
import _ring_jobs
import pytest
import torch

from _launch_util import outputs, results

from ringtrain.checkpoint import sharded
from ringtrain.checkpoint.folder import CheckpointDir

def _train(folder, **fault: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``ringtrain run --nproc-per-node 2 --max-restarts 1 _fault_jobs.py train --strategy fsdp`` into ``folder``."""
    return jobs.run_train(folder, "--strategy", "fsdp", **fault)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    proc, paths = _train(tmp_path_factory.mktemp("clean"))
    assert proc.returncode == 0, outputs(proc)
    return proc, paths


def _resumed_from(proc) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith("ringtrain: resumed from")]


@pytest.mark.timeout(240)
def test_periodic_fsdp_checkpoints_are_sharded_folders(uninterrupted):
    proc, paths = uninterrupted
    assert [(r["rank"], r["steps"]) for r in results(proc.stdout)] == [("0", "15"), ("1", "15")], outputs(proc)
    manifest = json.loads((paths["ckpt"] / "manifest.json").read_text())
    assert [e["file"] for e in manifest["checkpoints"]] == ["step-000000012", "step-000000015"]  # keep_last=2
    assert sorted(os.listdir(paths["ckpt"])) == ["losses", "manifest.json", "step-000000012", "step-000000015"]
    for name in ("step-000000012", "step-000000015"):
        assert sharded.problem(str(paths["ckpt"] / name)) is None
        assert {"__0_0.distcp", "__1_0.distcp"} <= set(os.listdir(paths["ckpt"] / name))


@pytest.mark.timeout(240)
def test_fsdp_rank_killed_mid_epoch_resumes_exactly(uninterrupted, tmp_path):
    # rank 1 SIGKILLs itself after step 8. The newest complete checkpoint is step 6 (epoch 1, one batch in) —
    # or step 3 (epoch 0, three batches in) when step 6's asynchronous write was still in flight: both mid-epoch.
    crashed, paths = _train(tmp_path / "crashed", RINGTRAIN_TEST_KILL_AT_STEP="8", RINGTRAIN_TEST_KILL_RANK="1",
                            RINGTRAIN_TEST_KILL_MARKER=str(tmp_path / "killed"))
    assert crashed.returncode == 0, outputs(crashed)
    assert _resumed_from(crashed) in (
        [f"ringtrain: resumed from {paths['ckpt'] / 'step-000000006'} (epoch 1, step 6)"],
        [f"ringtrain: resumed from {paths['ckpt'] / 'step-000000003'} (epoch 0, step 3)"]), outputs(crashed)
    clean = torch.load(uninterrupted[1]["out"])
    assert (torch.load(paths["out"]) - clean).abs().max().item() <= 1e-6
    assert [row["step"] for row in jobs.StepLog.read(str(paths["log"] / "rank1.jsonl"))] == list(range(1, 16))


@pytest.mark.timeout(240)
def test_killed_during_an_asynchronous_save_keeps_the_previous_one(uninterrupted, tmp_path):
    # Every rank waits 3 s before writing its shards. Step 3's save starts before step 4; step 6's save waits
    # for it, then starts; rank 1 is SIGKILLed right after step 7, while step 6's save is in flight. The
    # newest listed checkpoint is step 3, whole; the restart resumes there and ends as the clean run.
    crashed, paths = _train(tmp_path / "crashed", RINGTRAIN_TEST_SLOW_WRITE="3", RINGTRAIN_TEST_KILL_AT_STEP="7",
                            RINGTRAIN_TEST_KILL_RANK="1", RINGTRAIN_TEST_KILL_MARKER=str(tmp_path / "killed"))
    assert crashed.returncode == 0, outputs(crashed)
    assert _resumed_from(crashed) == [f"ringtrain: resumed from {paths['ckpt'] / 'step-000000003'} (epoch 0, step 3)"]
    clean = torch.load(uninterrupted[1]["out"])
    assert (torch.load(paths["out"]) - clean).abs().max().item() <= 1e-6
    # the interrupted save's staging folder was removed on restart; only complete checkpoints remain
    assert sorted(os.listdir(paths["ckpt"])) == ["losses", "manifest.json", "step-000000012", "step-000000015"]


@pytest.mark.timeout(240)
def test_sharded_resume_at_another_world_size_trains_every_sample_once(run_ranks, tmp_path):
    # 2 ranks, 40 samples, batch 4: stop after step 7; the newest checkpoint is step 6 (epoch 1, 8 samples
    # done). Resume on 4 ranks (the shards are cut anew) and finish.
    folder = str(tmp_path / "ckpt")
    (_, seen0), (_, seen1) = run_ranks(_ring_jobs.periodic, folder, 3, 7, strategy="fsdp", timeout=150)
    assert sorted(os.listdir(folder)) == ["losses", "manifest.json", "step-000000004", "step-000000006"]
    first = [s for s in seen0[: 6 * 4] + seen1[: 6 * 4] if s[0] == 1]
    rest = run_ranks(_ring_jobs.periodic, folder, 3, strategy="fsdp", nprocs=4, timeout=200)
    params, _ = rest[0]
    assert params is not None and torch.isfinite(params).all()
    second = [s for _, seen in rest for s in seen if s[0] == 1]
    epoch1 = collections.Counter(i for _, i in first + second)
    assert sorted(epoch1) == list(range(40))  # nothing skipped
    assert [i for i, times in epoch1.items() if times > 1] == []  # nothing repeated


@pytest.mark.timeout(150)
def test_a_rank_that_finishes_while_the_main_process_writes_its_part_alone_is_no_fault(run_ranks, tmp_path):
    # The newest save's collective part is over; rank 0 still writes the metadata and the manifest (slowly, as
    # at low priority on a busy CPU) when rank 1 closes: waiting for that is not waiting for rank 1.
    folder = str(tmp_path / "ckpt")
    run_ranks(_ring_jobs.periodic_slow_commit, folder, 3, 7, timeout=120)
    assert sorted(os.listdir(folder)) == ["losses", "manifest.json", "step-000000003", "step-000000006"]


def test_prepare_removes_only_our_staging_folders(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / ".step-000000006.ab12cd_9.tmp").mkdir()  # a sharded save cut short
    (folder / ".step-000000006.ab12cd_9.tmp" / "__0_0.distcp").write_bytes(b"half")
    (folder / ".step-000000004.zz12cd_9.tmp.old").mkdir()  # an older folder on its way out
    (folder / ".step-000000008.notours.tmp").mkdir()  # not mkdtemp's shape: left alone
    (folder / "step-000000010").mkdir()  # unlisted: never ours to delete
    with pytest.warns(UserWarning, match="rebuil|no complete"):
        CheckpointDir(folder).prepare()
    assert sorted(os.listdir(folder)) == [".step-000000008.notours.tmp", "step-000000010"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("damage", ["zeros", "truncated"])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_job_resumes_and_keeps_saving(run_ranks, tmp_path, damage):
    """Issue 31, item 4: the newest sharded checkpoint is damaged (a shard of the right size filled with zeros:
    DCP's CheckpointException, a BaseException; or truncated). The restart resumes from the previous whole one,
    the damaged folder is set aside under a name that says so (never deleted), and saving goes on — the next
    save at that step's name writes a new folder — ending as a run never damaged."""
    folder = tmp_path / "ckpt"
    clean = run_ranks(_ring_jobs.periodic, str(tmp_path / "clean"), 4, strategy="fsdp")[0][0]
    run_ranks(_ring_jobs.periodic, str(folder), 4, stop_at_step=16, strategy="fsdp")  # 5 steps an epoch
    newest = folder / "step-000000016"
    shard = newest / "__1_0.distcp"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        if damage == "zeros":
            f.write(b"\0" * size)
        else:
            f.truncate(size // 2)
    resumed = run_ranks(_ring_jobs.periodic, str(folder), 4, strategy="fsdp")[0][0]
    assert torch.equal(resumed, clean)
    names = sorted(os.listdir(folder))
    assert "step-000000016.damaged" in names and "step-000000020" in names, names
    manifest = [e["file"] for e in json.loads((folder / "manifest.json").read_text())["checkpoints"]]
    assert "step-000000016.damaged" not in manifest
