"""comm/ops.py: how each dtype and reduction travels through the engine (int16 as int32, bool as
uint8 with logical ops, Average as Sum then divided), scaling and averaging integers the way C does,
Horovod's op values, and the dtype codes of the metadata check."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ringtrain.comm import ops
from ringtrain.comm.ops import ReduceOp
from ringtrain.errors import RingtrainError

ENGINE = {ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.AVERAGE: dist.ReduceOp.SUM, ReduceOp.MIN: dist.ReduceOp.MIN,
          ReduceOp.MAX: dist.ReduceOp.MAX, ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT}


def test_horovods_op_values():
    assert [(op.name, int(op)) for op in ReduceOp] == [
        ("AVERAGE", 0), ("SUM", 1), ("ADASUM", 2), ("MIN", 3), ("MAX", 4), ("PRODUCT", 5)]
    assert ops.as_op(3) is ReduceOp.MIN and ops.as_op(ReduceOp.SUM) is ReduceOp.SUM


@pytest.mark.parametrize("bad", ["Sum", 9, None, 1.5j])
def test_an_unknown_op_is_named(bad):
    with pytest.raises(RingtrainError) as error:
        ops.as_op(bad)
    assert f"unknown reduction op {bad!r}" in str(error.value)
    assert "HINT: use one of Average, Sum, Adasum, Min, Max, Product" in str(error.value)


@pytest.mark.parametrize("op", list(ENGINE))
def test_most_dtypes_travel_as_themselves_average_as_sum(op):
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.uint8, torch.int8):
        assert ops.wire(dtype, op) == (dtype, ENGINE[op])


@pytest.mark.parametrize("op", list(ENGINE))
def test_int16_travels_as_int32_and_wraps_back_exactly(op):
    assert ops.wire(torch.int16, op) == (torch.int32, ENGINE[op])
    summed = torch.tensor([30000, -30000], dtype=torch.int16).to(torch.int32) * 2
    assert summed.to(torch.int16).tolist() == [-5536, 5536]  # what an int16 sum of two ranks' values wraps to


def test_bool_travels_as_uint8_with_logical_meaning():
    assert ops.wire(torch.bool, ReduceOp.SUM) == (torch.uint8, dist.ReduceOp.MAX)  # or
    assert ops.wire(torch.bool, ReduceOp.MAX) == (torch.uint8, dist.ReduceOp.MAX)
    assert ops.wire(torch.bool, ReduceOp.MIN) == (torch.uint8, dist.ReduceOp.MIN)  # and
    assert ops.wire(torch.bool, ReduceOp.PRODUCT) == (torch.uint8, dist.ReduceOp.MIN)
    with pytest.raises(RingtrainError) as error:
        ops.wire(torch.bool, ReduceOp.AVERAGE)
    assert "an Average reduction of bool tensors was asked for" in str(error.value)
    assert "HINT: use op=Sum or Max (logical or) or op=Min or Product (logical and)." in str(error.value)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.uint16, torch.float8_e4m3fn])
def test_an_unsupported_dtype_is_named_with_the_supported_ones(dtype):
    with pytest.raises(RingtrainError) as error:
        ops.wire(dtype, ReduceOp.SUM)
    text = str(error.value)
    assert f"a reduction over {dtype} tensors was asked for; reductions support uint8, int8, int16" in text
    assert "bfloat16, float32, float64, bool" in text
    assert "HINT: cast the tensor to one of those dtypes (broadcast/allgather/alltoall move any dtype)." in text


def test_adasum_is_not_an_engine_reduction():
    with pytest.raises(AssertionError, match="Adasum is not an engine reduction"):
        ops.wire(torch.float32, ReduceOp.ADASUM)


def test_scale_multiplies_floats_and_truncates_integers_toward_zero():
    x = torch.tensor([1.5, -2.0])
    assert ops.scale_(x, 2.0) is x and x.tolist() == [3.0, -4.0]
    ints = torch.tensor([5, -5, 7], dtype=torch.int32)
    assert ops.scale_(ints, 0.5).tolist() == [2, -2, 3] and ints.dtype == torch.int32
    assert ops.scale_(torch.tensor([3, -3]), 2.5).tolist() == [7, -7]
    same = torch.tensor([True])
    assert ops.scale_(same, 1.0) is same  # a factor of 1 touches nothing, bools included
    with pytest.raises(RingtrainError) as error:
        ops.scale_(torch.tensor([True]), 2.0)
    assert "a scale factor was given for a bool tensor" in str(error.value)
    assert "HINT: drop prescale/postscale for bool tensors." in str(error.value)


def test_finish_divides_an_average_by_the_set_size_then_postscales():
    assert ops.finish_(torch.tensor([3.0, 5.0]), ReduceOp.AVERAGE, 1.0, 2).tolist() == [1.5, 2.5]
    assert ops.finish_(torch.tensor([-3, 3, 7]), ReduceOp.AVERAGE, 1.0, 2).tolist() == [-1, 1, 3]  # C division
    assert ops.finish_(torch.tensor([4.0]), ReduceOp.AVERAGE, 3.0, 2).tolist() == [6.0]
    assert ops.finish_(torch.tensor([3.0]), ReduceOp.SUM, 1.0, 2).tolist() == [3.0]
    assert ops.finish_(torch.tensor([3.0]), ReduceOp.AVERAGE, 1.0, 1).tolist() == [3.0]


def test_dtype_codes_are_distinct_round_trip_and_unknown_is_99():
    assert len(set(ops.DTYPE_CODE.values())) == len(ops.DTYPE_CODE)
    assert all(ops.CODE_DTYPE[ops.dtype_code(d)] is d for d in ops.DTYPE_CODE)
    assert all(d in ops.DTYPE_CODE for d in ops.SUPPORTED_DTYPES)
    assert ops.dtype_code(torch.bool) == 1 and ops.dtype_code(torch.float32) == 9  # on the wire (checks.py)
    assert ops.dtype_code(torch.quint8) == 99


def test_byte_rows_view_the_same_storage_row_by_row():
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    rows = ops.byte_rows(x)
    assert rows.shape == (2, 12) and rows.dtype == torch.uint8 and rows.data_ptr() == x.data_ptr()
    assert ops.byte_rows(torch.tensor(1.0)).shape == (1, 4)
    assert ops.byte_rows(torch.empty(3, 0)).shape == (3, 0)
    assert ops.row_bytes(torch.empty(5, 3, 4, dtype=torch.float16)) == 24
    assert ops.row_bytes(torch.empty(5)) == 4
