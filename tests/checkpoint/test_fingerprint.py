"""A run's configuration fingerprint (fingerprint.py): what it records and how differences read."""

from __future__ import annotations

import torch
from torch import nn

from ringtrain.checkpoint import fingerprint


def _run(model: nn.Module, optimizer: torch.optim.Optimizer, world_size: int = 2, global_batch: int = 8) -> dict:
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    return {"entries": {"model": fingerprint.of_module(shapes), "optimizer": fingerprint.of_optimizer(optimizer)},
            "world_size": world_size, "global_batch": global_batch}


def test_the_same_configuration_has_no_differences_and_plain_values_only():
    model = nn.Linear(4, 2)
    run = _run(model, torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1))
    again = _run(nn.Linear(4, 2), torch.optim.AdamW(nn.Linear(4, 2).parameters(), lr=1e-3, betas=(0.9, 0.95),
                                                    weight_decay=0.1, foreach=False))  # an implementation choice
    assert fingerprint.differences(run, again, ["model", "optimizer"]) == []
    group = run["entries"]["optimizer"]["groups"][0]
    assert run["entries"]["optimizer"]["class"] == "AdamW" and group["betas"] == [0.9, 0.95] and group["lr"] == 1e-3
    assert run["entries"]["model"]["parameters"] == {"bias": [2], "weight": [2, 4]}
    assert "foreach" not in group and "params" not in group


def test_differences_name_what_changed():
    model, bigger = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)), nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 2))
    saved = _run(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    groups = [{"params": bigger[0].parameters()}, {"params": bigger[1].parameters(), "lr": 0.01}]
    now = _run(bigger, torch.optim.SGD(groups, lr=0.2, momentum=0.9, weight_decay=1e-4))
    assert fingerprint.differences(saved, now, ["model", "optimizer"]) == [
        "model: parameter shapes: 0.weight (3, 4) -> (5, 4), 0.bias (3,) -> (5,), 1.weight (2, 3) -> (2, 5)",
        "optimizer: 1 parameter group(s) -> 2",
        "optimizer group 0: lr 0.1 -> 0.2, weight_decay 0 -> 0.0001",
    ]
    renamed = _run(nn.Sequential(nn.Linear(4, 3)), torch.optim.Adam(nn.Linear(4, 3).parameters(), lr=0.1))
    lines = fingerprint.differences(saved, renamed, ["model", "optimizer"])
    assert lines[0] == "model: parameters only in the checkpoint: 1.weight, 1.bias"
    assert lines[1] == "optimizer: SGD -> Adam"
    assert "momentum 0.9 -> (none)" in lines[2] and "betas (none) -> [0.9, 0.999]" in lines[2]


def test_a_schedulers_base_rate_is_recorded_not_the_current_one():
    model = nn.Linear(2, 2)
    plain = _run(model, torch.optim.SGD(model.parameters(), lr=0.1))
    scheduled = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.optim.lr_scheduler.LambdaLR(scheduled, lambda step: 0.01)  # warm-up: the rate is 0.001 at step 0
    assert scheduled.param_groups[0]["lr"] != 0.1
    assert fingerprint.differences(plain, _run(model, scheduled), ["optimizer"]) == []


def test_a_global_batch_that_follows_the_world_size_is_not_a_difference():
    saved = {"world_size": 2, "global_batch": 8}
    assert fingerprint.batch_difference(saved, 2, 8) == (None, False)
    assert fingerprint.batch_difference(saved, 4, 16) == ("global batch 8 -> 16", True)
    assert fingerprint.batch_difference(saved, 2, 16) == ("global batch 8 -> 16", False)
    assert fingerprint.batch_difference({"world_size": 2}, 2, 16) == (None, False)  # none recorded
