"""Activation checkpointing (strategies/checkpointing.py): bitwise equal to no checkpointing under FSDP2, DDP and
tensor parallelism on 2 Gloo ranks (SGD); the names, state_dict keys and checkpoint keys the user's model had; the
blocks it finds, and what it refuses. Jobs are in _ac_jobs.py (one launch runs every case).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import _ac_jobs as jobs
import _tp_jobs as tp_jobs
import ringtrain as rt
from _launch_util import launch_ranks
from ringtrain.strategies.checkpointing import Checkpointing, apply_activation_checkpointing, mode_of

pytestmark = pytest.mark.timeout(300)

# 4 steps each: 2 ranks x 4 samples of data parallelism, or one TP group reading 8
LAYOUTS = {"fsdp": {"strategy": "fsdp", "batch": 4}, "ddp": {"strategy": "ddp", "batch": 4},
           "tp": {"strategy": "tp", "tp": 2, "batch": 8}}
MODES = (None, "full", "selective")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("ac")
    fits = {f"{layout}-{mode}": {**case, "ac": mode, "save": str(folder / f"{layout}-{mode}.pt")}
            for layout, case in LAYOUTS.items() for mode in MODES}
    fits.update({f"pipeline-{mode}": {"strategy": "pipeline", "ac": mode} for mode in MODES})
    fits["fsdp-offload-full"] = {**LAYOUTS["fsdp"], "fsdp": {"offload": "cpu"}, "ac": "full"}
    return launch_ranks(jobs.job, 2, args=(fits,), timeout=280)[0]


def max_diff(a: dict, b: dict) -> float:
    assert list(a) == list(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_checkpointing_is_bitwise_equal_to_none_on_two_ranks(two_ranks, layout, mode):
    got, ref = two_ranks[f"{layout}-{mode}"], two_ranks[f"{layout}-None"]
    assert got["modes"] == [mode, mode] and ref["modes"] == [None, None]
    assert len(got["losses"]) == 4 and got["losses"] == ref["losses"]
    assert max_diff(got["model"], ref["model"]) == 0.0


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_a_pipelines_stages_are_checkpointed_bitwise_equal_to_none(two_ranks, mode):
    got, ref = two_ranks[f"pipeline-{mode}"], two_ranks["pipeline-None"]
    assert mode in got["modes"] and not any(ref["modes"])  # rank 0's stage: its Linears
    assert len(got["losses"]) == 3 and got["losses"] == ref["losses"]
    assert max_diff(got["model"], ref["model"]) == 0.0


def test_fsdp_with_cpu_offload_and_checkpointing_equals_fsdp_alone(two_ranks):
    """torch's CPUOffloadPolicy (shards, gradients and the optimizer step on the CPU) with full AC: on a CPU job the
    copies are to the same memory, so this checks the offload path's arithmetic, not the transfers (the GPU test in
    test_fsdp.py does those)."""
    got, ref = two_ranks["fsdp-offload-full"], two_ranks["fsdp-None"]
    assert got["modes"] == ["full", "full"] and got["losses"] == ref["losses"]
    assert max_diff(got["model"], ref["model"]) == 0.0


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_names_and_checkpoint_keys_are_unchanged(two_ranks, layout):
    """No ``_checkpoint_wrapped_module.`` anywhere: a checkpoint saved with AC loads without it, and the other way."""
    ref = two_ranks[f"{layout}-None"]
    for mode in ("full", "selective"):
        got = two_ranks[f"{layout}-{mode}"]
        assert got["names"] == ref["names"] and list(got["model"]) == list(ref["model"])
        assert got["file_keys"] == ref["file_keys"] and got["folder_keys"] == ref["folder_keys"]
        assert not any("_checkpoint_wrapped_module" in k for k in got["file_keys"] + got["folder_keys"])


# --- in one process ------------------------------------------------------------------------------

def _train(model: nn.Module, steps: int = 3) -> dict:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = tp_jobs.data()[:8]
    for _ in range(steps):
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad()
    return model.state_dict()


def _peak_bytes(model: nn.Module) -> float:
    """The peak of a forward and backward, by torch's MemTracker (parameters, gradients, activations, temporaries)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    x, _ = tp_jobs.data()[:8]
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        model(x).sum().backward()
    return sum(per_device["Total"] for per_device in tracker.get_tracker_snapshot("peak").values())


def test_single_process_equal_and_saves_less():
    torch.manual_seed(0)
    plain = tp_jobs.Tiny()
    peaks = {}
    for mode in MODES:
        model = tp_jobs.Tiny()
        model.load_state_dict(plain.state_dict())
        assert apply_activation_checkpointing(model, mode) == ([] if mode is None else ["blocks.0", "blocks.1"])
        peaks[mode] = _peak_bytes(_copy(model, mode))
        if mode is not None:
            assert max_diff(_train(model), _train(_copy(plain))) == 0.0
            assert isinstance(model.blocks[0], tp_jobs.Block) and type(model.blocks[0]).__name__ == "Block"
    assert peaks["full"] < peaks["selective"] < peaks[None]


class NormBlock(nn.Module):  # a ResNet block's shape: conv, BatchNorm, and a residual
    def __init__(self, momentum: float | None):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.norm = nn.BatchNorm2d(3, momentum=momentum)

    def forward(self, x):
        return x + F.relu(self.norm(self.conv(x)))


@pytest.mark.parametrize("momentum", [0.1, None])  # None: BatchNorm's cumulative average, 1 / num_batches_tracked
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_batchnorm_counts_each_batch_once_under_checkpointing(mode, momentum):
    """torch's checkpoint reruns a block's forward in the backward, BatchNorm's running-statistics update included:
    every batch was counted twice (running stats and num_batches_tracked off after one step, evaluation drifted)."""
    torch.manual_seed(0)
    plain = nn.Sequential(NormBlock(momentum), NormBlock(momentum))
    checkpointed = nn.Sequential(NormBlock(momentum), NormBlock(momentum))
    checkpointed.load_state_dict(plain.state_dict())
    assert apply_activation_checkpointing(checkpointed, mode) == ["0", "1"]
    for model in (plain, checkpointed):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(1)
        for _ in range(3):
            model(torch.randn(4, 3, 5, 5)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    assert max_diff(checkpointed.state_dict(), plain.state_dict()) == 0.0  # weights, running stats, batches counted
    assert int(checkpointed[0].norm.num_batches_tracked) == 3 and checkpointed[0].norm.momentum == momentum


def _copy(model: nn.Module, mode: str | None = None) -> nn.Module:
    other = tp_jobs.Tiny()
    other.load_state_dict(model.state_dict())
    apply_activation_checkpointing(other, mode)
    return other


def test_the_ring_checkpoints_the_blocks_and_a_named_block_class():
    ring = rt.Ring(activation_checkpointing="selective")
    model = ring.setup(tp_jobs.Tiny())
    assert [mode_of(b) for b in model.blocks] == ["selective"] * 2 and mode_of(model) is None
    ring.close()
    ring = rt.Ring(activation_checkpointing=Checkpointing("full", blocks=[tp_jobs.MLP]))
    model = ring.setup(tp_jobs.Tiny())
    assert [mode_of(b.mlp) for b in model.blocks] == ["full"] * 2 and mode_of(model.blocks[0]) is None
    ring.close()


def test_a_model_on_the_meta_device_is_checkpointed_without_memory():
    """What a memory planner calls: no process group, no weights."""
    with torch.device("meta"):
        model = tp_jobs.Tiny(layers=3)
    assert apply_activation_checkpointing(model, "full") == ["blocks.0", "blocks.1", "blocks.2"]
    assert apply_activation_checkpointing(model, "full") == ["blocks.0", "blocks.1", "blocks.2"]  # idempotent
    assert all(p.is_meta for p in model.parameters()) and mode_of(model.blocks[2]) == "full"


def test_a_model_without_blocks_is_refused_saying_how_to_name_them():
    with pytest.raises(rt.RingtrainError, match=r"has no repeated block[\s\S]*HINT: name the blocks: "
                                                r"activation_checkpointing=rt.strategies.Checkpointing"):
        apply_activation_checkpointing(tp_jobs.MLP(), "full")  # two Linears, not in a container: no block
    with pytest.raises(rt.RingtrainError, match="no module that blocks= names"):
        apply_activation_checkpointing(tp_jobs.Tiny(), "full", blocks=[nn.Conv2d])


@pytest.mark.parametrize("kwargs, match", [
    ({"activation_checkpointing": "some"}, r"activation_checkpointing='some'[\s\S]*HINT: use None"),
    ({"activation_checkpointing": True}, r"activation_checkpointing=True"),
    ({"activation_checkpointing": Checkpointing("full", blocks=[tp_jobs.Block]), "compile": "yes"},
     r"compile='yes'[\s\S]*HINT"),
])
def test_bad_options_are_refused_before_anything_starts(kwargs, match):
    with pytest.raises(rt.RingtrainError, match=match):
        rt.Ring(**kwargs)


def test_checkpointing_objects_check_their_options():
    with pytest.raises(rt.RingtrainError, match=r"blocks='blocks'[\s\S]*HINT"):
        Checkpointing("full", blocks="blocks")
    with pytest.raises(rt.RingtrainError, match="Checkpointing\\(mode=None\\)"):
        Checkpointing(None)
