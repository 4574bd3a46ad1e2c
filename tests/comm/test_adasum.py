"""comm/adasum.py: Horovod's pairwise rule against its formula on small vectors, per segment, its
threshold, the binary tree over ranks, the refusals, and the real pairwise exchange on 2 ranks."""

from __future__ import annotations

import math
import sys

import _comm_jobs as jobs
import pytest
import torch

from ringtrain.comm import adasum
from ringtrain.comm.groups import ProcessSet
from ringtrain.errors import RingtrainError


def formula(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b, in float64."""
    a, b = a.double(), b.double()
    return (1 - a.dot(b) / (2 * a.dot(a))) * a + (1 - a.dot(b) / (2 * b.dot(b))) * b


def test_orthogonal_vectors_add_and_equal_ones_average():
    a, b = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])
    assert adasum.pair(a, b, [2]).tolist() == [3.0, 4.0]
    assert adasum.pair(torch.tensor([1.0, 2.0, 2.0]), torch.tensor([2.0, 1.0, -2.0]), [3]).tolist() == [3.0, 3.0, 0.0]
    assert adasum.pair(a, a, [2]).tolist() == [3.0, 0.0]  # (1 - 1/2) a + (1 - 1/2) a


def test_pair_is_the_formula_on_small_vectors():
    # a.b = 2, |a|^2 = 4, |b|^2 = 1: 0.75 a + 0 b
    assert adasum.pair(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0]), [2]).tolist() == [1.5, 0.0]
    # a.b = 1, |a|^2 = 2, |b|^2 = 1: 0.75 a + 0.5 b
    assert adasum.pair(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0]), [2]).tolist() == [1.25, 0.75]
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        a, b = torch.randn(7, generator=g, dtype=torch.float64), torch.randn(7, generator=g, dtype=torch.float64)
        assert torch.allclose(adasum.pair(a, b, [7]), formula(a, b), rtol=1e-15, atol=0)


def test_each_segment_is_combined_on_its_own():
    a = torch.tensor([3.0, 0.0, 1.0, 1.0])
    b = torch.tensor([0.0, 4.0, 1.0, 0.0])
    assert adasum.pair(a, b, [2, 2]).tolist() == [3.0, 4.0, 1.25, 0.75]
    assert not torch.allclose(adasum.pair(a, b, [4]), adasum.pair(a, b, [2, 2]))  # one segment: another result


def test_math_is_float64_rounded_once_to_the_tensors_dtype():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(16, generator=g).half(), torch.randn(16, generator=g).half()
    out = adasum.pair(a, b, [16])
    assert out.dtype == torch.float16
    assert torch.equal(out, formula(a, b).half())


def test_a_norm_below_sqrt_dbl_min_gets_coefficient_one():
    assert adasum._TINY == math.sqrt(sys.float_info.min)
    tiny = torch.tensor([1e-80, 0.0], dtype=torch.float64)  # |a|^2 = 1e-160 < 1.49e-154: added, not averaged
    assert adasum.pair(tiny, tiny, [2]).tolist() == [2e-80, 0.0]
    small = torch.tensor([1e-70, 0.0], dtype=torch.float64)  # 1e-140 is above it: averaged
    assert adasum.pair(small, small, [2]).tolist() == [1e-70, 0.0]
    b = torch.tensor([1.0, -2.0])
    assert adasum.pair(torch.zeros(2), b, [2]).tolist() == [1.0, -2.0]  # a zero vector leaves the other whole


def test_combine_is_the_binary_tree_lower_rank_first():
    g = torch.Generator().manual_seed(2)
    v = [torch.randn(5, generator=g, dtype=torch.float64) for _ in range(4)]
    tree = adasum.pair(adasum.pair(v[0], v[1], [5]), adasum.pair(v[2], v[3], [5]), [5])
    assert torch.equal(adasum.combine(v, [5]), tree)
    chain = adasum.pair(adasum.pair(adasum.pair(v[0], v[1], [5]), v[2], [5]), v[3], [5])
    assert not torch.allclose(adasum.combine(v, [5]), chain)  # levels pair results, not a running sum
    assert torch.equal(adasum.combine([v[0]], [5]), v[0])


@pytest.mark.parametrize("size", [3, 5, 6])
def test_a_set_of_other_than_a_power_of_two_is_refused(size):
    error = adasum.check_size(ProcessSet(range(size)))
    assert isinstance(error, RingtrainError)
    assert f"op=Adasum needs a power-of-two number of ranks, and this process set has {size}" in str(error)
    assert "HINT: run 2, 4, 8, ... processes, or use op=Average." in str(error)


def test_powers_of_two_and_float_dtypes_pass():
    assert [adasum.check_size(ProcessSet(range(n))) for n in (1, 2, 4, 8)] == [None] * 4
    assert [adasum.check_dtype(d) for d in adasum.FLOAT_DTYPES] == [None] * 4


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.bool, torch.complex64])
def test_a_non_float_dtype_is_refused(dtype):
    error = adasum.check_dtype(dtype)
    assert f"op=Adasum was asked for on a {dtype} tensor; Adasum combines floating-point tensors only" in str(error)
    assert "HINT: cast to a floating dtype, or use op=Sum/Average for integers." in str(error)


def test_one_rank_leaves_tensors_as_they_are():
    tensors = [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]
    adasum.adasum_(tensors, ProcessSet(None))  # this process alone: no group, rank 0 of 1
    assert tensors[0].tolist() == [1.0, 2.0] and tensors[1].tolist() == [[3.0]]
    adasum.adasum_([], ProcessSet(None))


@pytest.mark.timeout(90)
def test_two_ranks_exchange_and_both_get_the_pair_bit_for_bit(two_ranks):
    v0, v1 = (torch.cat(jobs.adasum_input(r)) for r in range(2))
    want = adasum.pair(v0, v1, jobs.ADASUM_SIZES)
    for res in two_ranks:
        assert torch.equal(res["adasum"], want)
    assert want[:3].tolist() == [3.0, 1.0, 1.0]  # the first tensor's vectors are orthogonal: summed
    assert torch.allclose(want[3:].double(), formula(v0[3:], v1[3:]))  # the second, combined on its own
