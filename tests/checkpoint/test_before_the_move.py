"""Checkpoints written before the house moved (issue 29, item 9) still load: a full file and a sharded folder made
by ringtrain at d066746 (tests/data/before-move/make.py) — model, Adam, StepLR and the script's extras."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

import ringtrain as rt
from ringtrain.checkpoint import sharded

DATA = Path(__file__).resolve().parents[1] / "data" / "before-move"


def _fresh():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)


@pytest.mark.parametrize("form", ["full.pt", "sharded"])
def test_a_checkpoint_from_before_the_move_loads(form, tmp_path):
    expected = torch.load(DATA / "expected_model.pt", weights_only=True)
    source = tmp_path / form
    (shutil.copytree if (DATA / form).is_dir() else shutil.copy)(DATA / form, source)
    ring = rt.Ring()
    model, optimizer, scheduler = ring.setup(*_fresh())
    extra = ring.load(str(source), model=model, optimizer=optimizer, scheduler=scheduler)
    assert extra["epoch"] == 1 and extra["note"] == "written before the move"
    got = model.state_dict()
    assert list(got) == list(expected)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert optimizer.state_dict()["state"][0]["step"].item() == 8  # 2 epochs x 4 batches
    assert scheduler.last_epoch == 2 and optimizer.param_groups[0]["lr"] == pytest.approx(0.0025)
    assert ring.optimizer_steps == 8
    ring.close()


def test_a_sharded_folder_from_before_the_move_consolidates(tmp_path):
    tree = sharded.consolidate(str(DATA / "sharded"), str(tmp_path / "whole.pt"))
    expected = torch.load(DATA / "expected_model.pt", weights_only=True)
    assert all(torch.equal(tree["model"][k], expected[k]) for k in expected)
    assert torch.load(tmp_path / "whole.pt", weights_only=True)["epoch"] == 1
