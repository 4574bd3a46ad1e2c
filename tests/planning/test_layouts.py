"""Which layouts a plan weighs, their names and the line that runs each (planning/layouts.py)."""

from __future__ import annotations

import pytest

import _plan_jobs as jobs
from ringtrain.errors import RingtrainError
from ringtrain.planning.layouts import Layout, candidates


def test_one_rank_is_one_device_with_each_ac_mode():
    names = [l.name for l in candidates(jobs.MLP(), 1)]
    assert names == ["one device", "one device + AC full", "one device + AC selective"]


def test_a_node_of_four_weighs_ddp_fsdp_tp_and_their_products():
    names = {l.name for l in candidates(jobs.Transformer(), 4, ac_modes=("off",), offload=False)}
    assert names == {"DDP 4", "FSDP 4", "DDP 2 x TP 2", "FSDP 2 x TP 2", "TP 4"}


def test_two_nodes_add_hsdp_and_keep_tp_within_a_node():
    layouts = candidates(jobs.Transformer(), 4, nnodes=2, ac_modes=("off",), offload=False)
    assert "HSDP 2x2" in {l.name for l in layouts}
    assert max(l.tp for l in layouts) == 2


def test_a_model_without_blocks_gets_no_activation_checkpointing():
    assert {l.ac for l in candidates(jobs.nn.Linear(4, 4), 2)} == {"off"}


def test_the_strategy_line_runs_the_layout():
    assert Layout("fsdp", dp_shard=4, tp=2, ac="full").strategy_line() == \
        'rt.Ring(strategy=rt.strategies.FSDP(tp=2), activation_checkpointing="full")'
    assert Layout("fsdp", dp_replicate=2, dp_shard=4).strategy_line() == \
        "rt.Ring(strategy=rt.strategies.FSDP(replicate=2))"
    assert Layout("ddp", dp_replicate=8).strategy_line() == 'rt.Ring(strategy="ddp")'
    assert Layout("fsdp", dp_shard=8, offload=True).strategy_line() == \
        'rt.Ring(strategy=rt.strategies.FSDP(offload="cpu"))'


def test_a_world_the_nodes_do_not_divide_is_refused():
    with pytest.raises(RingtrainError, match="nodes"):
        candidates(jobs.MLP(), 3, nnodes=2)
