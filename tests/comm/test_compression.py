"""comm/compression.py: which tensors travel cast (floating ones, as float16 / bfloat16), what comes
back (their own dtype, the cast's rounding), which are left alone (integers, bools: the same object),
and Horovod's compressor interface."""

from __future__ import annotations

import pytest
import torch

from ringtrain.comm.compression import (
    BF16Compressor,
    Compression,
    Compressor,
    FP16Compressor,
    NoneCompressor,
)

THIRD = 1.0 / 3.0


@pytest.mark.parametrize("compressor, wire", [(FP16Compressor, torch.float16), (BF16Compressor, torch.bfloat16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_floating_tensors_travel_cast_and_come_back_in_their_dtype(compressor, wire, dtype):
    x = torch.tensor([THIRD, 1.0, -2.5], dtype=dtype)
    sent, ctx = compressor.compress(x)
    assert sent.dtype == wire and ctx == dtype and sent.element_size() == 2  # half the bytes (or a quarter)
    back = compressor.decompress(sent, ctx)
    assert back.dtype == dtype
    assert back.tolist() == [torch.tensor(THIRD, dtype=wire).item(), 1.0, -2.5]  # the cast's rounding, once
    assert back[0].item() != THIRD


def test_bf16_keeps_float32s_range_where_fp16_overflows():
    x = torch.tensor([1e30, 70000.0])
    fp16 = FP16Compressor.decompress(*FP16Compressor.compress(x))
    bf16 = BF16Compressor.decompress(*BF16Compressor.compress(x))
    assert torch.isinf(fp16).all()  # float16's largest is 65504
    assert torch.isfinite(bf16).all() and torch.allclose(bf16, x, rtol=2 ** -8, atol=0)


@pytest.mark.parametrize("compressor", [FP16Compressor, BF16Compressor])
@pytest.mark.parametrize("x", [torch.tensor([1, 2, 3]), torch.tensor([1, -1], dtype=torch.int16),
                               torch.tensor([True, False])])
def test_integer_and_bool_tensors_are_left_alone(compressor, x):
    sent, ctx = compressor.compress(x)
    assert sent is x and ctx == x.dtype
    assert compressor.decompress(sent, ctx) is sent


def test_a_tensor_already_in_the_wire_dtype_is_not_copied():
    x = torch.tensor([0.5, 2.0], dtype=torch.float16)
    sent, ctx = FP16Compressor.compress(x)
    assert sent is x and ctx == torch.float16
    assert FP16Compressor.decompress(sent, ctx) is sent
    y = torch.tensor([0.5], dtype=torch.bfloat16)
    sent, ctx = FP16Compressor.compress(y)  # bfloat16 is floating: it travels as float16 and comes back
    assert sent.dtype == torch.float16 and FP16Compressor.decompress(sent, ctx).dtype == torch.bfloat16


def test_none_sends_as_it_is_and_decompress_ignores_a_missing_context():
    x = torch.tensor([THIRD])
    sent, ctx = NoneCompressor.compress(x)
    assert sent is x and ctx is None and NoneCompressor.decompress(sent, ctx) is x
    half = torch.tensor([0.5], dtype=torch.float16)
    assert FP16Compressor.decompress(half, None) is half  # no context: nothing to restore


def test_horovods_names_and_interface():
    assert (Compression.none, Compression.fp16, Compression.bf16) == (NoneCompressor, FP16Compressor, BF16Compressor)
    assert all(issubclass(c, Compressor) for c in (NoneCompressor, FP16Compressor, BF16Compressor))

    class Half(Compressor):  # only one of the two static methods
        @staticmethod
        def compress(tensor):
            return tensor, None

    with pytest.raises(TypeError, match="decompress"):
        Half()
