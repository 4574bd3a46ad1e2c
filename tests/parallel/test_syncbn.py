"""SyncBatchNorm on CPU/Gloo: 2 real ranks x b must equal 1 process x 2b with plain BatchNorm."""

from __future__ import annotations

import time

import pytest
from _launch_util import launch_ranks
import torch
from torch import nn

import _syncbn_jobs as jobs
from ringtrain import RingtrainError
from ringtrain.parallel.syncbn import SyncBatchNorm, convert_sync_batchnorm, revert_sync_batchnorm

pytestmark = pytest.mark.timeout(180)

TOL = {"atol": 1e-5, "rtol": 1e-5}


def check_equivalence(results: list[dict], ref: dict, sizes: tuple[int, ...]) -> None:
    world = len(sizes)
    bounds = [sum(sizes[:r]) for r in range(world + 1)]
    for r, out in enumerate(results):
        rows = slice(bounds[r], bounds[r + 1])
        torch.testing.assert_close(out["y"], ref["y"][rows], **TOL)
        torch.testing.assert_close(out["eval_y"], ref["eval_y"][rows], **TOL)
        # Each rank's loss is W times its share of the global mean: see _syncbn_jobs.
        torch.testing.assert_close(out["x_grad"] / world, ref["x_grad"][rows], **TOL)
        for key in ("running_mean", "running_var"):
            torch.testing.assert_close(out[key], ref[key], **TOL)
        assert out["num_batches_tracked"] == ref["num_batches_tracked"] == jobs.STEPS
    for key in ("w_grad", "b_grad"):
        if ref[key] is None:
            assert all(out[key] is None for out in results)
            continue
        # What DDP does to parameter gradients: the mean over ranks.
        averaged = torch.stack([out[key] for out in results]).mean(0)
        torch.testing.assert_close(averaged, ref[key], **TOL)


# (kind, per-rank batch sizes, momentum, affine)
EVEN = [(kind, (4, 4), 0.1, True) for kind in sorted(jobs.TAILS)]
OPTIONS = [("2d", (3, 3), None, True), ("2d", (3, 3), 0.1, False), ("1d_ncl", (3, 3), None, False)]
# Uneven and empty (N=0) batches: the empty rank still joins both all_reduces with count 0,
# so nobody hangs and the statistics stay those of the concatenated batch.
UNEVEN = [("2d", (3, 5), 0.1, True), ("1d_nc", (0, 4), 0.1, True), ("3d", (2, 0), None, True)]
CASES = EVEN + OPTIONS + UNEVEN


@pytest.fixture(scope="module")
def two_rank_runs():
    """Every case in ONE 2-rank Gloo job (what ``run_ranks`` does, once per module: start-up
    of two torch processes dominates on a small CPU machine). Returns {case: per-rank results}."""
    per_rank = launch_ranks(jobs.equivalence_cases, 2, args=(CASES,), timeout=150)
    return {case: [rank[i] for rank in per_rank] for i, case in enumerate(CASES)}


def _ids(cases):
    return [f"{k}-{'x'.join(map(str, s))}-momentum={m}-affine={a}" for k, s, m, a in cases]


@pytest.mark.parametrize("case", EVEN, ids=_ids(EVEN))
def test_two_ranks_equal_one_process(two_rank_runs, case):
    check_equivalence(two_rank_runs[case], jobs.reference(*case), case[1])


@pytest.mark.parametrize("case", OPTIONS, ids=_ids(OPTIONS))
def test_momentum_none_and_affine_false(two_rank_runs, case):
    check_equivalence(two_rank_runs[case], jobs.reference(*case), case[1])


@pytest.mark.parametrize("case", UNEVEN, ids=_ids(UNEVEN))
def test_uneven_and_empty_batches(two_rank_runs, case):
    check_equivalence(two_rank_runs[case], jobs.reference(*case), case[1])


def test_bfloat16_inputs_and_untracked_stats(run_ranks):
    sizes = (3, 5)
    results = run_ranks(jobs.low_precision_and_untracked, sizes)
    x, _ = jobs.batch("2d", sum(sizes), 0)
    plain = jobs.plain_layer("2d")
    y = plain(x.bfloat16().float())  # the same (rounded) values, in float32
    untracked = nn.BatchNorm2d(jobs.C, track_running_stats=False)
    y_untracked = untracked(x)
    for r, out in enumerate(results):
        rows = slice(sum(sizes[:r]), sum(sizes[: r + 1]))
        assert out["y_bf16"].dtype == torch.bfloat16
        torch.testing.assert_close(out["y_bf16"].float(), y[rows], atol=2e-2, rtol=1e-2)
        # Statistics are summed in float64 from the bf16 values: as exact as float32 BatchNorm.
        torch.testing.assert_close(out["running_mean"], plain.running_mean, **TOL)
        torch.testing.assert_close(out["running_var"], plain.running_var, **TOL)
        torch.testing.assert_close(out["y_untracked"], y_untracked[rows].detach(), **TOL)
    untracked.eval()
    torch.testing.assert_close(results[0]["y_untracked_eval"], untracked(x[:3]).detach(), **TOL)


def test_eval_on_one_rank_uses_running_stats_and_does_not_hang(run_ranks):
    start = time.monotonic()
    results = run_ranks(jobs.eval_one_rank, 15.0, timeout=60)
    assert time.monotonic() - start < 30
    main = results[0]
    assert main["seconds"] < 5
    assert main["max_err"] < 1e-6
    assert main["frozen_grad_ok"]


def test_ddp_training_matches_one_process(run_ranks):
    """Gold standard: 3 SGD steps through ring.setup (real DDP), conv + BN2d + BN1d."""
    expected = jobs.train_conv(sync=False)
    results = run_ranks(jobs.train_conv, True)
    for state in results:
        assert state.keys() == expected.keys()
        for key, value in expected.items():
            torch.testing.assert_close(state[key], value, atol=1e-5, rtol=1e-5, msg=key)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL SyncBatchNorm needs 2 CUDA devices")
def test_nccl_path_matches_one_process(run_ranks):
    """On CUDA + NCCL the layer hands over to torch's own fused function: same contract."""
    case = ("2d", (3, 5), 0.1, True)
    check_equivalence(run_ranks(jobs.equivalence, *case), jobs.reference(*case), case[1])


# --- single process ----------------------------------------------------------------------


def test_single_process_is_plain_batchnorm():
    torch.manual_seed(0)
    plain = nn.BatchNorm2d(3, momentum=None)
    sync = SyncBatchNorm(3, momentum=None)
    for step in range(3):
        x = torch.randn(5, 3, 4, 4) * 2 + 1
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        y1, y2 = plain(x1), sync(x2)
        torch.testing.assert_close(y2, y1)
        (y1 * x).sum().backward()
        (y2 * x).sum().backward()
        torch.testing.assert_close(x2.grad, x1.grad)
    torch.testing.assert_close(sync.weight.grad, plain.weight.grad)
    for buffer in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(sync, buffer), getattr(plain, buffer))
    plain.eval(), sync.eval()
    x = torch.randn(2, 3, 4, 4)
    torch.testing.assert_close(sync(x), plain(x))


def nested_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(2, 4, 3),
        nn.BatchNorm2d(4),
        nn.ModuleList([nn.BatchNorm1d(5), nn.Sequential(nn.Linear(5, 5), nn.BatchNorm1d(5, affine=False))]),
        nn.ModuleDict({"deep": nn.Sequential(nn.BatchNorm3d(6, momentum=None, eps=1e-3))}),
    )


def trained(model: nn.Module) -> nn.Module:
    """Give every BN layer non-default weights and statistics."""
    with torch.no_grad():
        for i, m in enumerate(model.modules()):
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.add_(i)
                m.running_var.mul_(i + 2)
                m.num_batches_tracked.fill_(i + 3)
                if m.affine:
                    m.weight.mul_(i + 1.5)
                    m.bias.add_(i)
    return model


def test_convert_keeps_weights_buffers_names_and_flags():
    plain = trained(nested_model())
    plain[1].weight.requires_grad_(False)
    plain[2][0].eval()
    expected = {k: v.clone() for k, v in plain.state_dict().items()}
    names = [n for n, _ in plain.named_modules()]
    weight = plain[1].weight

    converted = convert_sync_batchnorm(plain)
    kinds = {n: type(m) for n, m in converted.named_modules()}
    assert list(kinds) == names
    assert [kinds[n] for n in ("1", "2.0", "2.1.1", "3.deep.0")] == [SyncBatchNorm] * 4
    assert not any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, SyncBatchNorm) for m in converted.modules()
    )
    assert converted[1].weight is weight  # same Parameter: an optimizer built before still works
    assert not converted[1].weight.requires_grad and converted[1].bias.requires_grad
    assert not converted[2][0].training and converted[1].training
    assert converted[2][1][1].weight is None and converted[3]["deep"][0].momentum is None
    assert converted[3]["deep"][0].eps == 1e-3
    modules = dict(converted.named_modules())
    assert [modules[n].bn_dim for n in ("1", "2.0", "2.1.1", "3.deep.0")] == [2, 1, 1, 3]
    state = converted.state_dict()
    assert state.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(state[key], value)

    # A checkpoint of the converted model loads into the plain model, and back.
    fresh_plain = nested_model()
    fresh_plain.load_state_dict(state)
    fresh_sync = convert_sync_batchnorm(nested_model())
    fresh_sync.load_state_dict(fresh_plain.state_dict())
    for key, value in expected.items():
        torch.testing.assert_close(fresh_plain.state_dict()[key], value)
        torch.testing.assert_close(fresh_sync.state_dict()[key], value)


def test_revert_gives_plain_classes_and_same_state():
    converted = convert_sync_batchnorm(trained(nested_model()))
    expected = {k: v.clone() for k, v in converted.state_dict().items()}
    reverted = revert_sync_batchnorm(converted)
    kinds = {n: type(m) for n, m in reverted.named_modules()}
    assert [kinds[n] for n in ("1", "2.0", "2.1.1", "3.deep.0")] == [
        nn.BatchNorm2d,
        nn.BatchNorm1d,
        nn.BatchNorm1d,
        nn.BatchNorm3d,
    ]
    assert not any(isinstance(m, SyncBatchNorm) for m in reverted.modules())
    for key, value in expected.items():
        torch.testing.assert_close(reverted.state_dict()[key], value)


def test_top_level_layer_and_dimension_from_input():
    layer = convert_sync_batchnorm(nn.BatchNorm3d(2))
    assert isinstance(layer, SyncBatchNorm) and layer.bn_dim == 3
    assert type(revert_sync_batchnorm(layer)) is nn.BatchNorm3d
    assert SyncBatchNorm.convert_sync_batchnorm(nn.BatchNorm1d(2)).bn_dim == 1

    built = SyncBatchNorm(2)  # made directly: the first input decides
    with pytest.raises(RingtrainError, match="BatchNorm1d, 2d or 3d"):
        revert_sync_batchnorm(built)
    built(torch.randn(3, 2, 4))
    assert type(revert_sync_batchnorm(built)) is nn.BatchNorm1d


def test_bad_inputs_are_loud():
    layer = SyncBatchNorm(3)
    with pytest.raises(RingtrainError, match="HINT: pass \\(N, C\\)"):
        layer(torch.randn(2, 3, 1, 1, 1, 1))
    with pytest.raises(RingtrainError, match="got 4 channels"):
        layer(torch.randn(2, 4, 5))
