"""Reduction operations and how each dtype travels through the engine.

Horovod names six reductions; ``torch.distributed`` has SUM, MIN, MAX and PRODUCT
(Gloo has no AVG) and neither Gloo nor NCCL moves every dtype: Gloo rejects int16
outright, NCCL has no int16 or bool. Everything here answers two questions —
which wire dtype and engine op carry a reduction faithfully, and what to do after
(average, scale, cast back) — so the collectives never branch on the backend.

Data-moving collectives (broadcast, allgather, alltoall) do not reduce anything,
so they send the tensor's bytes (``view(torch.uint8)``): every dtype, bit-exact.
"""

from __future__ import annotations

import enum

import torch
import torch.distributed as dist

from ..errors import RingtrainError


class ReduceOp(enum.IntEnum):
    """Horovod's reductions, with Horovod's numeric values (horovod/common/message.h)."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


# Every dtype Horovod's torch binding accepts (horovod/torch/adapter_v2.cc).
SUPPORTED_DTYPES = (
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool,
)

# Codes for the metadata check: stable small integers for every dtype torch knows.
_ALL_DTYPES = [
    getattr(torch, name) for name in (
        "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
        "complex64", "complex128", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "complex32",
    ) if hasattr(torch, name)
]
DTYPE_CODE = {dt: i + 1 for i, dt in enumerate(_ALL_DTYPES)}
CODE_DTYPE = {i: dt for dt, i in DTYPE_CODE.items()}


def dtype_code(dtype: torch.dtype) -> int:
    return DTYPE_CODE.get(dtype, 99)


def as_op(op) -> ReduceOp:
    try:
        return ReduceOp(int(op))
    except (TypeError, ValueError) as e:
        raise RingtrainError(
            f"unknown reduction op {op!r}",
            "use one of Average, Sum, Adasum, Min, Max, Product (hvd.Average ...).",
        ) from e


_ENGINE = {
    ReduceOp.AVERAGE: dist.ReduceOp.SUM,  # divided afterwards: Gloo has no AVG
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}


def wire(dtype: torch.dtype, op: ReduceOp) -> tuple[torch.dtype, "dist.ReduceOp"]:
    """The dtype a reduction travels in and the engine op that computes it.

    * int16 travels as int32: two's-complement sums and products agree modulo 2**16,
      so casting back wraps exactly as an int16 reduction would.
    * bool travels as uint8 with logical meaning: Sum and Max are OR, Min and Product AND.
    * everything else travels as itself.
    """
    if dtype not in SUPPORTED_DTYPES:
        raise RingtrainError(
            f"a reduction over {dtype} tensors was asked for; reductions support "
            f"{', '.join(str(d).replace('torch.', '') for d in SUPPORTED_DTYPES)}",
            "cast the tensor to one of those dtypes (broadcast/allgather/alltoall move any dtype).",
        )
    if op == ReduceOp.ADASUM:
        raise AssertionError("Adasum is not an engine reduction")  # routed to adasum.py
    if dtype == torch.bool:
        if op == ReduceOp.AVERAGE:
            raise RingtrainError(
                "an Average reduction of bool tensors was asked for",
                "use op=Sum or Max (logical or) or op=Min or Product (logical and).",
            )
        return torch.uint8, (dist.ReduceOp.MAX if op in (ReduceOp.SUM, ReduceOp.MAX) else dist.ReduceOp.MIN)
    if dtype == torch.int16:
        return torch.int32, _ENGINE[op]
    return dtype, _ENGINE[op]


def scale_(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """Multiply in place by ``factor``; integers are scaled in float64 and truncated, as C casts do."""
    if factor == 1.0:
        return tensor
    if tensor.is_floating_point():
        return tensor.mul_(factor)
    if tensor.dtype == torch.bool:
        raise RingtrainError("a scale factor was given for a bool tensor", "drop prescale/postscale for bool tensors.")
    return tensor.copy_((tensor.double() * factor).trunc())


def finish_(tensor: torch.Tensor, op: ReduceOp, postscale: float, size: int) -> torch.Tensor:
    """After the engine's reduction: Average divides by ``size``, then ``postscale`` applies.

    Integer averages are truncated toward zero (C integer division), computed exactly.
    """
    if op == ReduceOp.AVERAGE and size > 1:
        if tensor.is_floating_point():
            tensor.div_(size)
        else:
            tensor.copy_(torch.div(tensor, size, rounding_mode="trunc"))
    return scale_(tensor, postscale)


# torch 2.13 renamed the flat-tensor collectives; older versions only have the old names.
all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def byte_rows(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor as a ``(dim0, row_bytes)`` uint8 view sharing its storage."""
    flat = tensor.reshape(tensor.shape[0] if tensor.dim() else 1, -1)
    if flat.numel() == 0:
        return torch.empty((flat.shape[0], 0), dtype=torch.uint8, device=tensor.device)
    return flat.view(torch.uint8)


def row_bytes(tensor: torch.Tensor) -> int:
    rest = 1
    for d in tensor.shape[1:]:
        rest *= d
    return rest * tensor.element_size()
