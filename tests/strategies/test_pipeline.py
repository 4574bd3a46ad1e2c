"""strategy='pipeline': torch.distributed.pipelining stages on real Gloo ranks, equal to one process.

Each multi-process job trains several cases inside one process group (one spawn,
several schedules) to keep the file fast on small CPUs; jobs are in _pipeline_jobs.py.
"""

from __future__ import annotations

import os

import _pipeline_jobs as jobs
import pytest
from _launch_util import launch_ranks
import torch
from torch import nn

import ringtrain as rt
from ringtrain.parallel.environments import Environment
from ringtrain.strategies import Pipeline

pytestmark = pytest.mark.timeout(240)

TOL = 1e-5
PER_REPLICA = 8

CASES = {
    "gpipe": {"stages": 2, "microbatches": 4, "schedule": "gpipe", "split_at": ["2"], "steps": 3, "per_replica": PER_REPLICA},
    "1f1b": {"stages": 2, "microbatches": 4, "schedule": "1f1b", "split_at": ["4"], "steps": 3, "per_replica": PER_REPLICA},
    "interleaved": {"stages": 2, "microbatches": 4, "schedule": "interleaved", "split_at": ["2", "4", "6"], "steps": 3,
                        "per_replica": PER_REPLICA},
    # 2 batches per optimizer step, clipped by the global norm; fewer micro-batches than the batch has rows
    "accumulate_clip": {"stages": 2, "microbatches": 2, "schedule": "1f1b", "split_at": ["2"], "steps": 2,
                            "per_replica": PER_REPLICA, "accumulate": 2, "clip": 0.05},
    # the last batch is shorter (an epoch's tail): new stage buffers for the new shape
    "short_batch": {"stages": 2, "microbatches": 4, "schedule": "gpipe", "split_at": ["2"], "steps": 3, "per_replica": [8, 8, 4]},
    # BatchNorm in later stages: torch must not run them on uninitialised tensors (we give it the shapes)
    "bn_1f1b": {"stages": 2, "microbatches": 4, "schedule": "1f1b", "split_at": ["3"], "steps": 3, "per_replica": PER_REPLICA, "model": "bn"},
    "bn_interleaved": {"stages": 2, "microbatches": 4, "schedule": "interleaved", "split_at": ["2", "4", "6"], "steps": 3,
                           "per_replica": PER_REPLICA, "model": "bn"},
    "bf16": {"stages": 2, "microbatches": 4, "schedule": "gpipe", "split_at": ["2"], "steps": 2, "per_replica": PER_REPLICA,
                 "precision": "bf16-mixed"},
    "fp16": {"stages": 2, "microbatches": 4, "schedule": "1f1b", "split_at": ["2"], "steps": 2, "per_replica": PER_REPLICA,
                 "precision": "16-mixed", "clip": 0.05},
    "own_data": {"stages": 2, "microbatches": 4, "schedule": "gpipe", "split_at": ["2"], "steps": 3,
                 "per_replica": PER_REPLICA, "data": jobs.KeptWhole()},
}


def launch(fn, *args, nprocs=2):
    return launch_ranks(fn, nprocs, args=args, timeout=200)


@pytest.fixture(scope="module")
def two_ranks():
    """Every case of CASES trained by 2 ranks (2 stages x 1 replica), then a batch of 6 rows (not a multiple
    of 4), then an fp16 overflow planted in the last stage only."""
    ranks = launch(jobs.train_cases, list(CASES.values()), 6)
    return [{name: r for name, r in zip(CASES, rank)} | {"bad_batch": rank[-2], "overflow_seen": rank[-1]} for rank in ranks]


def max_diff(a: dict, b: dict) -> float:
    assert list(a) == list(b)
    return max((a[k] - b[k]).abs().max().item() for k in b)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved"])
def test_two_stages_equal_single_process(two_ranks, name):
    case = CASES[name]
    ref = jobs.reference(case["steps"], PER_REPLICA)
    got = two_ranks[0][name]
    assert got["state"] is not None and two_ranks[1][name]["state"] is None  # the full state lands on rank 0
    assert max_diff(got["state"], ref["state"]) <= TOL
    for rank in two_ranks:  # the step's loss comes back on every rank, the first stage included
        assert rank[name]["raw_losses"] == pytest.approx(ref["losses"], abs=TOL)


def test_a_data_strategy_of_ones_own_composes_through_the_contract(two_ranks):
    """Pipeline(data=...) takes any StageData (issue 29, item 6): the pipeline asks, never names it."""
    got, ref = two_ranks[0]["own_data"], jobs.reference(3, PER_REPLICA)
    assert max_diff(got["state"], ref["state"]) <= TOL
    assert got["asked"] == ["dims_over(1)", "place_stage", "run_stage"] and got["mesh"] == ("pp", "dp_replicate")
    with pytest.raises(rt.RingtrainError, match="(?s)Pipeline got data=.*HINT:.*StageData"):
        rt.strategies.Pipeline(stages=2, microbatches=2, data=object())


@pytest.mark.parametrize("name", ["bn_1f1b", "bn_interleaved"])
def test_batchnorm_statistics_equal_one_process_with_microbatches(two_ranks, name):
    # BatchNorm normalises each micro-batch: the reference is the same model through ringtrain.parallel.stages
    # with 4 micro-batches in one process. Running statistics and counters must match too.
    ref = jobs.reference(3, PER_REPLICA, model="bn", microbatches=4)
    got = two_ranks[0][name]["state"]
    assert "4.running_var" in got and got["4.num_batches_tracked"].item() == 3 * 4
    assert max_diff(got, ref["state"]) <= TOL


def test_accumulation_and_global_norm_clipping(two_ranks):
    ref = jobs.reference(2, PER_REPLICA, accumulate=2, clip=0.05)
    got = two_ranks[0]["accumulate_clip"]
    assert max_diff(got["state"], ref["state"]) <= TOL
    assert got["norms"] == two_ranks[1]["accumulate_clip"]["norms"]  # one global norm, not one per stage
    assert all(n > 0.05 for n in got["norms"])  # clipping actually happened


def test_batch_shape_change_between_steps(two_ranks):
    ref = jobs.reference(3, [8, 8, 4])
    assert max_diff(two_ranks[0]["short_batch"]["state"], ref["state"]) <= TOL


def test_bf16_autocast_stays_close(two_ranks):
    ref = jobs.reference(2, PER_REPLICA)
    assert max_diff(two_ranks[0]["bf16"]["state"], ref["state"]) <= 5e-3
    assert two_ranks[0]["bf16"]["losses"] != ref["losses"]  # autocast really ran


def test_fp16_loss_scaling_agrees_across_stages(two_ranks):
    ref = jobs.reference(2, PER_REPLICA, clip=0.05)
    got = [rank["fp16"] for rank in two_ranks]
    assert max_diff(got[0]["state"], ref["state"]) <= 5e-3
    assert got[0]["scale"] == got[1]["scale"]  # one loss scale for the whole pipeline
    assert got[0]["norms"] == pytest.approx([n for n in got[1]["norms"]])
    # An overflow in one stage reaches every stage's gradients, so every GradScaler skips the step.
    assert [rank["overflow_seen"] for rank in two_ranks] == [True, True]


def test_each_rank_keeps_only_its_stage(two_ranks):
    first, second = two_ranks[0]["gpipe"], two_ranks[1]["gpipe"]
    assert first["local_keys"] == ["0.weight", "0.bias"]
    assert second["local_keys"] == ["2.weight", "2.bias", "4.weight", "4.bias", "6.weight", "6.bias"]
    assert first["model_meta"] and second["model_meta"]  # the other stage's tensors were freed (meta)
    total = sum(p.numel() for p in jobs.make_model().parameters())
    assert first["local_params"] + second["local_params"] == total
    # interleaved: chunks 0 and 2 on rank 0, 1 and 3 on rank 1 (torch's loop placement), under the unsplit names
    assert two_ranks[0]["interleaved"]["local_keys"] == ["0.weight", "0.bias", "4.weight", "4.bias"]


def test_batch_not_divisible_by_microbatches(two_ranks):
    for rank in two_ranks:
        assert "cannot be cut into 4 equal micro-batches" in rank["bad_batch"] and "HINT:" in rank["bad_batch"]


FOUR_RANKS = {
    "ddp": {"stages": 2, "microbatches": 4, "schedule": "1f1b", "split_at": ["2"], "steps": 3, "per_replica": PER_REPLICA},
    # 2-D: pipeline x FSDP, each stage's 2 replicas hold half of it
    "fsdp": {"stages": 2, "microbatches": 4, "schedule": "1f1b", "split_at": ["2"], "steps": 3, "per_replica": PER_REPLICA,
             "data": "fsdp"},
    # torch's stage reduces gradients over the replicas after every step: still exact across a window
    "ddp_accumulate": {"stages": 2, "microbatches": 2, "schedule": "gpipe", "split_at": ["4"], "steps": 2,
                       "per_replica": PER_REPLICA, "accumulate": 2},
    "fsdp_accumulate_clip": {"stages": 2, "microbatches": 2, "schedule": "gpipe", "split_at": ["4"], "steps": 2,
                             "per_replica": PER_REPLICA, "accumulate": 2, "clip": 0.05, "data": "fsdp"},
}


@pytest.fixture(scope="module")
def four_ranks():
    ranks = launch(jobs.train_cases, list(FOUR_RANKS.values()), nprocs=4)
    return [{name: r for name, r in zip(FOUR_RANKS, rank)} for rank in ranks]


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_two_stages_by_two_replicas_equal_single_process_with_combined_batch(four_ranks, name):
    ref = jobs.reference(3, 2 * PER_REPLICA)
    assert max_diff(four_ranks[0][name]["state"], ref["state"]) <= TOL
    # rank = stage * replicas + replica: the mesh ("pp", 2) x ("dp_replicate" | "dp_shard", 2)
    assert [(r[name]["stage"], r[name]["replica"]) for r in four_ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in four_ranks:
        assert r[name]["losses"] == pytest.approx(ref["losses"], abs=TOL)
    assert four_ranks[0][name]["mesh"] == ("pp", "dp_shard" if name == "fsdp" else "dp_replicate")


@pytest.mark.parametrize("name", ["ddp_accumulate", "fsdp_accumulate_clip"])
def test_replicated_or_sharded_stages_accumulate_exactly(four_ranks, name):
    case = FOUR_RANKS[name]
    ref = jobs.reference(2, 2 * PER_REPLICA, accumulate=2, clip=case.get("clip"))
    assert max_diff(four_ranks[0][name]["state"], ref["state"]) <= TOL
    ref_opt, got_opt = ref["optimizer"], four_ranks[0][name]["optimizer"]
    assert got_opt["param_groups"] == ref_opt["param_groups"]
    for i, st in ref_opt["state"].items():
        assert (got_opt["state"][i]["momentum_buffer"] - st["momentum_buffer"]).abs().max().item() <= TOL


def test_fsdp_stages_hold_half_of_their_stage(four_ranks):
    ddp, fsdp = four_ranks[0]["ddp"], four_ranks[0]["fsdp"]
    assert fsdp["local_params"] < ddp["local_params"]
    assert fsdp["local_params"] == sum(-(-p.shape[0] // 2) * (p.numel() // p.shape[0])
                                       for p in jobs.make_model()[:2].parameters())


def test_checkpoint_is_unsplit_and_resumes_anywhere(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    resumes = [
        {"stages": 2, "microbatches": 4, "schedule": "gpipe", "split_at": ["4"], "per_replica": PER_REPLICA},  # 2 stages again
        {"stages": 1, "microbatches": 4, "schedule": "gpipe", "split_at": [], "per_replica": PER_REPLICA // 2},  # S=1 x D=2
    ]
    ranks = launch(jobs.save_then_resume, path, 4, 2, PER_REPLICA, resumes)
    uninterrupted = jobs.reference(4, PER_REPLICA)
    ckpt = torch.load(path, weights_only=True)
    assert list(ckpt["model"]) == list(jobs.make_model().state_dict())  # one unsplit state dict
    # A single process loads it with plain torch (load_state_dict on the unsplit model and its
    # optimizer, inside reference) and continues identically.
    single = jobs.reference(4, PER_REPLICA, start=2, state=ckpt["model"], optim_state=ckpt["optimizer"])
    assert max_diff(single["state"], uninterrupted["state"]) <= TOL
    for resumed in ranks[0]["resumed"]:
        assert max_diff(resumed["state"], uninterrupted["state"]) <= TOL
        assert resumed["losses"] == pytest.approx(uninterrupted["losses"][2:], abs=TOL)


def test_sharded_checkpoint_of_a_two_dimensional_layout_loads_into_any_layout(tmp_path):
    # pipeline x FSDP on 4 ranks writes a folder (each rank its shard of its stage); it loads exactly into
    # 2 stages x DDP on 2 ranks, FSDP without stages (1 stage x 2 replicas), and one process.
    path = str(tmp_path / "ckpt")
    model, optimizer, _ = launch(jobs.ring_save_or_load, path, "fsdp", 2, True, nprocs=4)[0]
    assert sorted(os.listdir(path)) == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp",
                                        "ringtrain.pt"]
    loaded = [launch(jobs.ring_save_or_load, path, "ddp", 2, False)[0],
              launch(jobs.ring_save_or_load, path, "fsdp", 1, False)[0]]
    single = jobs.make_model()
    single_opt = jobs.make_optimizer(single)
    ring = rt.Ring()
    single, single_opt = ring.setup(single, single_opt)
    extra = ring.load(path, model=single, optimizer=single_opt)
    loaded.append((single.state_dict(), single_opt.state_dict(), extra))
    for got_model, got_opt, got_extra in loaded:
        assert max_diff(got_model, model) == 0.0
        assert got_opt["param_groups"] == optimizer["param_groups"]
        for i, st in optimizer["state"].items():
            assert torch.equal(got_opt["state"][i]["momentum_buffer"], st["momentum_buffer"])
        assert got_extra == {"epoch": 3}


def test_the_global_batch_line_counts_replicas_not_processes():
    """Issue 33, item 2: 2 stages on 2 processes printed "global batch 8 = 8 per device x 1 device(s)": the number was
    right (both stages work on the same 8 samples), the words were not."""
    said = launch(jobs.global_batch_line, 2)
    assert said[0] == ("ringtrain: global batch 8 = 8 per replica x 1 replica(s) (each a pipeline of 2 stages, one "
                       "process each) x 1 accumulation step(s)\n"), said
    assert said[1] == ""


def test_stage_output_shape_change_is_a_clear_error():
    with pytest.raises(rt.RingtrainError, match="changed shape between micro-batches") as info:
        launch(jobs.shape_change)
    assert "fixed length" in str(info.value)


# --- errors raised before any process group exists ----------------------------------------
def env(world_size: int, rank: int = 0) -> Environment:
    return Environment(name="test", rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size)


def pipeline(world_size: int, **options) -> Pipeline:
    """A Pipeline strategy attached to rank 0 of a job of ``world_size`` (no process group formed)."""
    return Pipeline(**options).attach(env(world_size), device="cpu")


def test_stages_must_divide_world_size():
    with pytest.raises(rt.RingtrainError, match="do not divide the 3 processes") as info:
        pipeline(3, stages=2, microbatches=4)
    assert "multiple of 2" in info.value.hint


def test_1f1b_needs_as_many_microbatches_as_stages():
    with pytest.raises(rt.RingtrainError, match="at least as many micro-batches as stages") as info:
        pipeline(4, stages=4, microbatches=2, schedule="1f1b")
    assert "microbatches >= 4" in info.value.hint
    pipeline(4, stages=4, microbatches=2, schedule="gpipe")  # GPipe has no such limit
    with pytest.raises(rt.RingtrainError, match="whole number of rounds"):
        pipeline(4, stages=4, microbatches=9, schedule="interleaved")


def test_unknown_schedule_and_bad_counts():
    with pytest.raises(rt.RingtrainError, match="unknown pipeline schedule"):
        pipeline(2, stages=2, microbatches=4, schedule="zb")
    with pytest.raises(rt.RingtrainError, match="microbatches=0"):
        pipeline(2, stages=2, microbatches=0)


def test_split_names_that_do_not_exist():
    strategy = pipeline(2, stages=2, microbatches=4, split_at=["encoder.9"])
    with pytest.raises(rt.RingtrainError, match="encoder.9") as info:
        strategy.wrap_module(jobs.make_model())
    assert "available: 0, 1, 2" in info.value.hint


def test_split_point_count_must_match_stages():
    strategy = pipeline(2, stages=2, microbatches=4)
    with pytest.raises(rt.RingtrainError, match="make 3 stage") as info:
        strategy.wrap_module(jobs.make_model(), split_at=["2", "4"])
    assert "give 1 split point" in info.value.hint
    interleaved = pipeline(2, stages=2, microbatches=4, schedule="interleaved")
    with pytest.raises(rt.RingtrainError, match="2 or more model chunks per rank"):
        interleaved.wrap_module(jobs.make_model(), split_at=["2"])


    class Residual(nn.Module):  # forward is more than its children in a row
        def __init__(self):
            super().__init__()
            self.inner, self.outer = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.outer(x + self.inner(x))

    with pytest.raises(rt.RingtrainError, match="own forward"):
        strategy.wrap_module(Residual(), split_at=["outer"])
