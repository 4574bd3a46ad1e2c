"""``Ring(compile=True)`` (strategies/compiling.py): the order — tensor parallelism, then activation checkpointing,
then compile, then FSDP — checked with ``nn.Module.compile`` replaced by a recorder (no compiler runs: the fast
suite); what compile is refused with (tensor-parallel blocks, a pipeline); and, behind the ``compile`` marker
(``make test-compile``: minutes of compiling on a small CPU), the real compiler equal to eager, in one process and
under FSDP (with full AC) on 2 Gloo ranks.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import _ac_jobs as jobs
import _tp_jobs as tp_jobs
import ringtrain as rt
from _launch_util import launch_ranks
from ringtrain.strategies.compiling import BlockTransforms, Compile, apply_compile, is_compiled

pytestmark = pytest.mark.timeout(300)

ORDER = {
    # every block checkpointed, then compiled, then sharded
    "fsdp": {"strategy": "fsdp", "batch": 4, "ac": "full", "compile": True, "record": True},
    # dp_shard=1 x tp=2: the blocks are cut first — and compile then refuses DTensor blocks
    "fsdp_tp": {"strategy": "fsdp", "tp": 2, "batch": 8, "compile": True, "record": True, "refused": True},
    "tp_both": {"strategy": "tp", "tp": 2, "ac": "full", "compile": True, "record": True, "refused": True},
    "ddp": {"strategy": "ddp", "batch": 4, "ac": "selective", "compile": Compile(dynamic=False), "record": True},
}


@pytest.fixture(scope="module")
def recorded() -> dict:
    return launch_ranks(jobs.job, 2, args=(ORDER,), timeout=280)[0]


def test_fsdp_blocks_are_checkpointed_compiled_then_sharded(recorded):
    got = recorded["fsdp"]
    assert [s["class"] for s in got["seen"]] == ["Block", "Block"]
    assert all(s["checkpointing"] == "full" and not s["sharded"] for s in got["seen"])
    assert got["sharded_after"] == ["FSDPBlock", "FSDPBlock"]  # fully_shard came after compile
    assert got["applied"] == [("checkpointing", ["blocks.0", "blocks.1"]), ("compile", ["blocks.0", "blocks.1"])]
    assert len(got["losses"]) == 4


@pytest.mark.parametrize("name", ["fsdp_tp", "tp_both"])
def test_compile_of_tensor_parallel_blocks_is_refused(recorded, name):
    """The blocks reach compile cut (TP came first) and compile refuses them: torch 2.13's compiled DTensor blocks
    trained 7.6e-3 away from eager (with AC: failed in the backward), measured; nothing was compiled."""
    refused = recorded[name]["refused"]
    assert "compile=True under tensor parallelism is not supported yet" in refused and "HINT: drop compile=True" in refused


def test_ddp_blocks_are_checkpointed_then_compiled_with_the_options_given(recorded):
    got = recorded["ddp"]
    assert [(s["checkpointing"], s["tensor_parallel"], s["sharded"], s["options"]) for s in got["seen"]] == \
        [("selective", False, False, {"dynamic": False})] * 2


def test_one_process_applies_checkpointing_before_compile(monkeypatch):
    seen = []
    monkeypatch.setattr(nn.Module, "compile", jobs.recording_compile(seen))
    ring = rt.Ring(activation_checkpointing="full", compile=True)
    model = ring.setup(tp_jobs.Tiny())
    assert [s["checkpointing"] for s in seen] == ["full", "full"] and len(seen) == 2
    assert ring.strategy.blocks.applied[0][0] == "checkpointing"
    ring.close()


def test_compile_keeps_the_names_and_is_lazy():
    model = tp_jobs.Tiny()
    names = [n for n, _ in model.named_parameters()]
    assert apply_compile(model) == ["blocks.0", "blocks.1"]
    assert [n for n, _ in model.named_parameters()] == names and is_compiled(model.blocks[1])
    assert not is_compiled(model)  # nothing traced yet: the first forward compiles


def test_nothing_to_apply_does_nothing():
    transforms = BlockTransforms.of(None, False)
    model = tp_jobs.Tiny()
    assert not transforms and transforms.apply(model) is model and transforms.applied == []


def test_a_pipeline_refuses_compile_and_takes_checkpointing():
    pipeline = rt.strategies.Pipeline(stages=2, microbatches=2)
    with pytest.raises(rt.RingtrainError, match=r"compile=True with a pipeline is not supported yet[\s\S]*HINT"):
        pipeline.transform_blocks(BlockTransforms.of("full", True))
    pipeline.transform_blocks(BlockTransforms.of("full", False))
    assert pipeline.blocks.checkpointing.mode == "full"


def test_compile_without_blocks_is_refused_saying_how_to_name_them():
    with pytest.raises(rt.RingtrainError, match=r"compile=True: MLP has no repeated block[\s\S]*HINT: name the blocks"):
        apply_compile(tp_jobs.MLP())


# --- the real compiler (make test-compile) ---------------------------------------------------------

@pytest.fixture
def inductor_cache(tmp_path_factory, monkeypatch):
    """One cache folder for the compile tests (ranks and reruns reuse what was compiled)."""
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(tmp_path_factory.getbasetemp() / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", folder)
    return folder


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.compile
@pytest.mark.timeout(1200)
def test_compiled_blocks_equal_eager_in_one_process(inductor_cache):
    eager, compiled = jobs.fit({"ac": "selective"}), jobs.fit({"ac": "selective", "compile": True})
    assert len(compiled["losses"]) == 4
    assert _max_diff(compiled["model"], eager["model"]) <= 1e-6
    assert max(abs(a - b) for a, b in zip(compiled["losses"], eager["losses"])) <= 1e-6


@pytest.mark.compile
@pytest.mark.timeout(1800)
def test_compiled_blocks_equal_eager_under_fsdp(inductor_cache):
    case = {"strategy": "fsdp", "batch": 4, "ac": "full"}
    got = launch_ranks(jobs.job, 2, args=({"eager": case, "compiled": {**case, "compile": True}},), timeout=1700)[0]
    assert len(got["compiled"]["losses"]) == 4
    assert _max_diff(got["compiled"]["model"], got["eager"]["model"]) <= 1e-6
    assert max(abs(a - b) for a, b in zip(got["compiled"]["losses"], got["eager"]["losses"])) <= 1e-6
