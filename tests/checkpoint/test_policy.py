"""Ring(resume="auto" | "force" | "never") on a checkpoint_dir another configuration wrote (resume_policy.py).

A 2-rank job writes the folder; a run with another learning rate is refused on every rank with the
difference listed, leaving the folder as it was; the same configuration at another world size resumes
and says so; "force" resumes under the new configuration, printing the differences; "never" starts
afresh after moving the old checkpoints aside, deleting nothing.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import _ring_jobs as jobs
import ringtrain as rt

pytestmark = pytest.mark.timeout(240)


def _snapshot(folder: str) -> dict[str, bytes]:
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))
            if os.path.isfile(os.path.join(folder, name))}


def test_another_configuration_is_refused_under_auto_and_taken_under_force_or_never(run_ranks, tmp_path, capsys):
    folder = str(tmp_path / "ckpt")
    # 2 ranks x batch 4, 40 samples: 5 steps per epoch. Stopped after step 7: the newest checkpoint is step 6.
    run_ranks(jobs.periodic, folder, 2, 7)
    before = _snapshot(folder)
    assert sorted(before) == ["manifest.json", "step-000000004.pt", "step-000000006.pt"]

    # auto, another learning rate: refused at ring.setup on every rank, before anything is loaded or written.
    errors = run_ranks(jobs.periodic_refused, folder, 2, lr=0.05)
    assert errors[0] == errors[1]
    assert f"checkpoint_dir {folder!r} holds step-000000006.pt, written by a run configured differently" in errors[0]
    assert "\n  optimizer: lr 0.1 -> 0.05\nHINT: to continue from it under this configuration anyway, pass " \
           "Ring(resume='force')" in errors[0], errors[0]
    assert _snapshot(folder) == before  # and the refused job gave the folder back

    # auto, the same configuration on one process: resumed, saying what the world-size change means.
    capsys.readouterr()
    params, seen = jobs.periodic(folder, 2, batch_size=8)
    said = capsys.readouterr().out
    assert "step-000000006.pt was written by 2 processes, this run has 1: its state is loaded at the new size" in said
    assert f"ringtrain: resumed from {os.path.join(folder, 'step-000000006.pt')} (epoch 1, step 6)" in said
    assert len(seen) == 32  # epoch 1's last 4 steps of 8 samples: nothing redone
    assert "global batch 8 ->" not in said  # 8 = 8 per device x 1 device: unchanged

    # auto, another per-device batch: refused once the loader says what the global batch is.
    written = _snapshot(folder)
    error = jobs.periodic_refused(folder, 2, batch_size=16)
    assert "holds step-000000010.pt, written by a run configured differently:\n  global batch 8 -> 16\nHINT:" \
           in error, error
    assert _snapshot(folder) == written

    # force, another learning rate: resumed from the newest (step 10, the end), the difference printed.
    jobs.periodic(folder, 2, batch_size=8, lr=0.05, resume="force")
    said = capsys.readouterr().out
    assert "ringtrain: resume='force': resuming from step-000000010.pt although the configuration changed:\n" \
           "  optimizer: lr 0.1 -> 0.05" in said, said
    assert "resumed from" in said

    # never: a fresh start; the old run's files are moved aside, not deleted, and not rotated away later.
    kept = _snapshot(folder)
    params, seen = jobs.periodic(folder, 2, batch_size=8, lr=0.05, resume="never")
    said = capsys.readouterr().out
    aside = [name for name in os.listdir(folder) if name.startswith("previous-")]
    assert len(aside) == 1 and _snapshot(os.path.join(folder, aside[0])) == kept
    assert f"resume='never': starting afresh; what was in {folder} (manifest.json, step-000000008.pt, " \
           f"step-000000010.pt) was moved to {os.path.join(folder, aside[0])}, nothing deleted" in said, said
    assert "resumed from" not in said and len(seen) == 80
    fresh, _ = jobs.periodic(str(tmp_path / "fresh"), 2, batch_size=8, lr=0.05)
    assert torch.equal(params, fresh)
    assert [e["step"] for e in json.loads(open(os.path.join(folder, "manifest.json")).read())["checkpoints"]] == [8, 10]


def test_resume_argument_is_checked_before_anything_starts(tmp_path):
    with pytest.raises(rt.RingtrainError, match="resume='sometimes'") as info:
        rt.Ring(checkpoint_dir=str(tmp_path / "ckpt"), resume="sometimes")
    assert "HINT:" in str(info.value) and not (tmp_path / "ckpt").exists()
    with pytest.raises(rt.RingtrainError, match="resume='never' with checkpoint_dir=None"):
        rt.Ring(resume="never")
