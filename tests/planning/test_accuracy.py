"""The plan against real runs: each case's peak per rank, planned on fake tensors, is within 10 % of the peak torch's
memory tracker measures when the same model trains for real on 2 Gloo ranks (helpers/_plan_jobs.py)."""

from __future__ import annotations

import pytest
import torch

import _plan_jobs as jobs
from _launch_util import launch_ranks
from ringtrain.planning import plan

TOLERANCE = 0.10


@pytest.fixture(scope="module")
def measured() -> dict[str, int]:
    return launch_ranks(jobs.job, 2, args=(jobs.CASES,), timeout=280)[0]


@pytest.mark.parametrize("model_name,layout_name", jobs.CASES, ids=[f"{m}-{l}" for m, l in jobs.CASES])
def test_plan_is_within_ten_percent_of_the_real_peak(measured, model_name, layout_name):
    torch.manual_seed(0)
    model = jobs.MODELS[model_name]()
    planned = plan(model, torch.optim.AdamW(model.parameters(), lr=1e-3), jobs.batch_of(model_name), world_size=2,
                   layouts=[jobs.LAYOUTS[layout_name]]).rows[0]
    real = measured[f"{model_name}/{layout_name}"]
    assert planned.error is None
    assert abs(planned.peak - real) <= TOLERANCE * real, (planned.peak, real, planned.parts())
    assert planned.peak == sum(planned.parts().values())
