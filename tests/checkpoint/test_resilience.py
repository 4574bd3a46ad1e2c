"""Periodic checkpoints and resume, model mismatch across ranks, non-finite losses."""

from __future__ import annotations

import json
import os

import pytest
import torch

import _ring_jobs as jobs
import ringtrain as rt
from ringtrain.checkpoint.folder import CheckpointDir

pytestmark = pytest.mark.timeout(180)


def test_periodic_checkpoints_resume_mid_epoch_exactly(tmp_path):
    full, seen_full = jobs.periodic(str(tmp_path / "full"), 3)
    folder = str(tmp_path / "run")
    # 40 samples, batch 4: 10 steps per epoch. Stop at step 15 (mid-epoch 1): the newest
    # checkpoint is step 14; steps 15 is redone after the restart.
    _, seen_first = jobs.periodic(folder, 3, stop_at_step=15)
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    assert [e["step"] for e in manifest["checkpoints"]] == [12, 14]  # keep_last=2
    assert sorted(os.listdir(folder)) == ["losses", "manifest.json", "step-000000012.pt", "step-000000014.pt"]
    resumed, seen_second = jobs.periodic(folder, 3)
    assert (resumed - full).abs().max().item() <= 1e-6
    # Every sample of every epoch exactly as often as in the uninterrupted run.
    done_before_crash = seen_first[: 14 * 4]
    assert sorted(done_before_crash + seen_second) == sorted(seen_full)


def test_checkpoint_dir_ignores_unlisted_and_partial_files(tmp_path):
    folder = tmp_path / "ckpts"
    folder.mkdir()
    (folder / "step-000000099.pt").write_bytes(b"partial")  # not in the manifest: never complete
    (folder / ".step-000000100.pt.abc.tmp").write_bytes(b"half")
    d = CheckpointDir(folder, keep_last=2)
    d.prepare()
    assert d.latest() is None
    assert not (folder / ".step-000000100.pt.abc.tmp").exists()


def test_different_model_on_one_rank_is_named(run_ranks):
    errors = run_ranks(jobs.different_model_on_rank_one)
    for e in errors:
        assert "rank 1 set up a different model than rank 0" in e
        assert "2.weight" in e and "HINT:" in e


def test_nonfinite_loss_raises_with_step():
    # One process: with several, the raising rank ends and the launcher stops its peers.
    kind, message = jobs.nan_on_rank(0, "raise")
    assert kind == "error" and "optimizer step 2" in message and "HINT:" in message


def test_nonfinite_loss_skip_drops_the_step_on_every_rank(run_ranks):
    (p0, steps0, skipped0), (p1, steps1, skipped1) = run_ranks(jobs.nan_on_rank, 0, "skip")
    assert torch.equal(p0, p1) and torch.isfinite(p0).all()
    assert (steps0, skipped0) == (steps1, skipped1) == (3, 1)


def test_bad_checkpoint_arguments():
    with pytest.raises(rt.RingtrainError, match="save_every"):
        rt.Ring(save_every=10)
    with pytest.raises(rt.RingtrainError, match="keep_last"):
        rt.Ring(checkpoint_dir="x", keep_last=0)
    with pytest.raises(rt.RingtrainError, match="nonfinite"):
        rt.Ring(nonfinite="maybe")
