"""Every collective x every dtype x sync/async/in-place, on 2 and 4 Gloo ranks, against values
computed independently (``_hvd_expected``); gradients through the differentiable collectives."""

from __future__ import annotations

import pytest
import torch

import _hvd_expected as ex
import _hvd_jobs as jobs
from ringtrain.comm import adasum_combine

pytestmark = pytest.mark.timeout(180)


def same(got, want, what):
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if want.is_floating_point():
        assert torch.allclose(got.double(), want.double(), rtol=1e-6, atol=0), f"{what}: {got} != {want}"
    else:
        assert torch.equal(got, want), f"{what}: {got} != {want}"


def check_matrix(results: list[dict], modes) -> int:
    n = len(results)
    checked = 0
    for dtype in ex.DTYPES:
        d = str(dtype)
        for op in ex.OPS:
            if op == "Average" and dtype == torch.bool:
                continue
            want = ex.reduce([ex.value(r, dtype, jobs.SHAPE, f"ar{op}") for r in range(n)], op)
            for r in range(n):
                for mode in modes:
                    same(results[r][("allreduce", d, op, mode)], want, f"allreduce {d} {op} {mode} rank {r}")
                    checked += 1
        gathered = torch.cat([ex.value(r, dtype, (r + 1, 2), "ag") for r in range(n)])
        for r in range(n):
            for mode in ("sync", "async"):
                same(results[r][("allgather", d, mode)], gathered, f"allgather {d} {mode}")
                checked += 1
            for root in range(n):
                want = ex.value(root, dtype, jobs.SHAPE, f"bc{root}")
                for mode in ("sync", "async", "inplace", "async_inplace"):
                    same(results[r][("broadcast", d, root, mode)], want, f"broadcast {d} root {root} {mode}")
                    checked += 1
            splits = [ex.a2a_splits(j, n) for j in range(n)]
            inputs = [ex.value(j, dtype, (sum(splits[j]), 2), "a2a") for j in range(n)]
            want, received = ex.alltoall(inputs, splits, r)
            got, got_received = results[r][("alltoall", d, "splits")]
            same(got, want, f"alltoall {d}")
            assert got_received.tolist() == received and got_received.dtype == torch.int32
            got, got_received = results[r][("alltoall", d, "async")]
            same(got, want, f"alltoall async {d}")
            even = [ex.value(j, dtype, (2 * n, 3), "a2a-even") for j in range(n)]
            same(results[r][("alltoall", d, "even")], ex.alltoall(even, [[2] * n] * n, r)[0], f"alltoall even {d}")
            checked += 3
            for op in ("Sum", "Average", "Min", "Max"):
                if op == "Average" and dtype == torch.bool:
                    continue
                inputs = [ex.value(j, dtype, (2 * n + 1, 2), f"rs{op}") for j in range(n)]
                for mode in ("sync", "async"):
                    same(results[r][("reducescatter", d, op, mode)], ex.reducescatter(inputs, op, r),
                         f"reducescatter {d} {op} {mode} rank {r}")
                    checked += 1
    for r in range(n):
        xs = [[ex.value(j, dt, (2, 3), "grouped") for j in range(n)]
              for dt in (torch.float32, torch.int16, torch.float32, torch.int64)]
        for mode in ("sync", "async", "inplace"):
            for got, inputs in zip(results[r][("grouped_allreduce", mode)], xs):
                same(got, ex.reduce(inputs, "Sum"), f"grouped_allreduce {mode}")
        got = results[r][("grouped_allgather", "sync")]
        same(got[0], torch.cat([ex.value(j, torch.float32, (j + 1, 2), "gag") for j in range(n)]), "grouped_allgather")
        same(got[1], torch.cat([ex.value(j, torch.int16, (j + 2,), "gag") for j in range(n)]), "grouped_allgather")
        got = results[r][("grouped_reducescatter", "sync")]
        same(got[0], ex.reducescatter([ex.value(j, torch.float32, (2 * n + 1, 2), "grs") for j in range(n)], "Sum", r),
             "grouped_reducescatter")
        same(got[1], ex.reducescatter([ex.value(j, torch.int64, (n, 1), "grs") for j in range(n)], "Sum", r),
             "grouped_reducescatter")
        same(results[r][("scaled", "float")],
             ex.reduce([ex.value(j, torch.float32, jobs.SHAPE, "sc") for j in range(n)], "Sum", 0.5, 4.0), "scaled")
        same(results[r][("scaled", "int")],
             ex.reduce([ex.value(j, torch.int32, jobs.SHAPE, "sc") for j in range(n)], "Sum", 2.0, 0.5), "scaled int")
        same(results[r][("wrap", "int16")], ex.reduce([torch.tensor([30000, -30000], dtype=torch.int16)] * n, "Sum"),
             "int16 wrap-around")
        same(results[r][("noncontiguous", "allreduce_")],
             ex.reduce([ex.value(j, torch.float32, (4, 3), "nc") for j in range(n)], "Sum").t(), "non-contiguous")
        same(results[r][("scalar", "allreduce")], torch.tensor(float(n * (n + 1) // 2)), "0-d")
        same(results[r][("deprecated", "average")],
             ex.reduce([ex.value(j, torch.float32, jobs.SHAPE, "dep") for j in range(n)], "Sum"), "average=False")
        checked += 10
    return checked


def test_every_collective_dtype_and_mode_on_two_ranks(run_ranks):
    results = run_ranks(jobs.collective_matrix, nprocs=2)
    assert check_matrix(results, jobs.ALL_MODES) > 500


def test_four_ranks_matrix_adasum_and_process_sets(run_ranks):
    results = run_ranks(jobs.adasum_and_sets, nprocs=4)
    check_matrix([res["matrix"] for res in results], ("sync",))
    g = [[ex.value(r, torch.float32, (5,), "ad") for r in range(4)], [ex.value(r, torch.float64, (2, 3), "ad2")
                                                                      for r in range(4)]]
    want = [adasum_combine([t.reshape(-1) for t in ts], [ts[0].numel()]).view_as(ts[0]) for ts in g]
    # the formula by hand, for the first pair, as documented: (1 - a.b/2|a|^2) a + (1 - a.b/2|b|^2) b
    a, b = g[0][0].double(), g[0][1].double()
    by_hand = (1 - a.dot(b) / (2 * a.dot(a))) * a + (1 - a.dot(b) / (2 * b.dot(b))) * b
    assert torch.allclose(adasum_combine([g[0][0], g[0][1]], [5]).double(), by_hand, atol=1e-6)
    for r, res in enumerate(results):
        for got, w in zip(res["adasum"], want):
            assert torch.allclose(got.double(), w.double(), atol=1e-6), (got, w)
        assert torch.equal(res["adasum"][0], results[0]["adasum"][0])  # bit-identical on every rank
        assert torch.allclose(res["adasum_single"], want[0], atol=1e-6)
        members = [0, 2] if r % 2 == 0 else [1, 3]
        assert res["set_ids"] == (1, 2, 2, members.index(r), True, False)
        assert res["set_allreduce"].item() == sum(members)
        assert res["set_allgather"].tolist() == members
        assert res["set_broadcast"].item() == members[-1]
        pair = [ex.value(m, torch.float32, (4,), "sad") for m in members]
        assert torch.allclose(res["set_adasum"], adasum_combine(pair, [4]), atol=1e-6)
        assert res["set_object"] == [m * 10 for m in members]
        assert "not in that process set" in res["not_member"]
        assert res["removed"] == (True, False)


def test_adasum_two_ranks_by_hand_and_three_ranks_refuse(run_ranks):
    results = run_ranks(jobs.three_ranks, nprocs=3)
    for r, res in enumerate(results):
        assert "power-of-two" in res["adasum"] and "HINT:" in res["adasum"], res["adasum"]
        assert "mismatched collectives" in res["one_differs"] and "rank 2: allreduce(float32[4]" in res["one_differs"]
        inputs = [ex.value(j, torch.float32, (7, 2), "rs3") for j in range(3)]
        assert torch.equal(res["reducescatter"], ex.reducescatter(inputs, "Sum", r))
        assert res["reducescatter"].shape[0] == [3, 2, 2][r]
        want = ex.reduce([ex.value(j, torch.float32, (5,), "avg3") for j in range(3)], "Average")
        assert torch.allclose(res["average"], want, rtol=1e-6)


def test_gradients_follow_horovods_rules(run_ranks):
    n = 2
    results = run_ranks(jobs.autograd_cases, nprocs=n)
    w = lambda r, shape, salt: ex.value(r, torch.float64, shape, "w" + salt)  # noqa: E731
    total = n * (n + 1) // 2
    for r, res in enumerate(results):
        ws = [w(j, jobs.SHAPE, "ar") for j in range(n)]
        # allreduce: the gradient is the same allreduce (op and scale factors) of the upstream gradients
        assert torch.allclose(res[("allreduce", "Sum")], sum(ws) * 2.0 * 0.5)
        assert torch.allclose(res[("allreduce", "Average")], sum(ws) / n * 2.0 * 0.5)
        for i, got in enumerate(res[("grouped_allreduce", "Sum")]):
            assert torch.allclose(got, sum(w(j, (2,), f"g{i}") for j in range(n)))
        # allgather: averaged allreduce of the upstream gradient, narrowed to this rank's rows
        avg = sum(w(j, (total, 2), "ag") for j in range(n)) / n
        start = sum(j + 1 for j in range(r))
        assert torch.allclose(res[("allgather",)], avg[start:start + r + 1])
        # broadcast: averaged allreduce on the root, zero elsewhere
        avg = sum(w(j, jobs.SHAPE, "bc") for j in range(n)) / n
        assert torch.allclose(res[("broadcast",)], avg if r == n - 1 else torch.zeros_like(avg))
        # alltoall: the reverse alltoall of the upstream gradient
        splits = [ex.a2a_splits(j, n) for j in range(n)]
        received = [[splits[j][k] for j in range(n)] for k in range(n)]
        upstream = [w(k, (sum(received[k]), 2), "a2a") for k in range(n)]
        back, _ = ex.alltoall(upstream, received, r)
        assert torch.allclose(res[("alltoall",)], back)
        # reducescatter: allgather of the upstream gradient, times size for Sum
        for op, factor in (("Sum", n), ("Average", 1)):
            rows = ex.reducescatter_rows(2 * n + 1, n)
            up = torch.cat([w(j, (rows[j], 2), "rs") for j in range(n)])
            assert torch.allclose(res[("reducescatter", op)], up * factor)
        assert torch.allclose(res[("allreduce", "fp16")], torch.full(jobs.SHAPE, 2.0 * n))
