"""``rt.plan`` from Python: its rows, files and refusals (planning/__init__.py, report.py, mode.py)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import _plan_jobs as jobs
import ringtrain as rt
from ringtrain.errors import RingtrainError
from ringtrain.planning import Layout
from ringtrain.planning.report import SCHEMA


def _mlp_plan(**keywords):
    model = jobs.MLP()
    return model, rt.plan(model, torch.optim.AdamW(model.parameters()), jobs.batch_of("mlp"), **keywords)


def test_rows_split_the_peak_and_the_fastest_that_fits_is_marked(tmp_path):
    model, plan = _mlp_plan(world_size=2, device="a100", ac=("off", "full"), offload=False)
    assert [r.layout for r in plan] == ["DDP 2", "DDP 2 + AC full", "FSDP 2", "FSDP 2 + AC full", "TP 2",
                                        "TP 2 + AC full"]  # the MLP's blocks pair up for TP
    for row in plan:
        assert row.error is None and row.fits and row.flops > 0 and row.step_s > 0
        assert row.peak == sum(row.parts().values())
    ddp, fsdp = plan[0], plan[2]
    assert fsdp.optimizer < ddp.optimizer  # the optimizer's state sharded over 2 ranks
    assert ddp.traffic["dp_replicate"] > 0 and fsdp.traffic["dp_shard"] > 0
    assert sum(r.fastest for r in plan) == 1
    paths = plan.save(str(tmp_path))
    saved = json.loads(open(paths[0]).read())
    assert saved["schema"] == SCHEMA and len(saved["rows"]) == 6
    assert saved["parameters"] == sum(p.numel() for p in model.parameters())
    assert "* fastest that fits" in open(paths[1]).read()


def test_a_device_too_small_fits_nothing_and_says_what_to_do():
    _, plan = _mlp_plan(world_size=1, device_memory="1MiB", ac=("off",))
    assert not any(r.fits for r in plan) and plan.fastest() is None
    assert "no layout fits" in plan.table() and "HINT:" in plan.table()


def test_mixed_precision_and_a_meta_model_plan_without_allocating():
    with torch.device("meta"):
        model = jobs.Transformer()
    batch = torch.randint(0, 128, (8, 64), device="meta")
    plan = rt.plan(model, torch.optim.AdamW(model.parameters()), batch, world_size=2, precision="bf16-mixed",
                   layouts=[Layout("fsdp", dp_shard=2), Layout("single", tp=2)])
    assert all(r.error is None and r.peak > 0 for r in plan)
    assert all(p.is_meta for p in model.parameters())


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        y = self.linear(x)
        return y[y > 0].sum()  # the output's shape depends on the values


def test_a_model_the_fake_mode_cannot_run_is_refused_with_the_op():
    model = DataDependent()
    with pytest.raises(RingtrainError) as caught:
        rt.plan(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(4, 8), world_size=1)
    assert "could not trace" in str(caught.value) and "register_fake" in caught.value.hint


def test_planning_after_a_process_group_formed_is_refused(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    with pytest.raises(RingtrainError, match="already formed a process group"):
        _mlp_plan(world_size=2)
