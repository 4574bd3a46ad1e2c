"""Gradient compression on the wire: Horovod's ``Compression.none`` and ``Compression.fp16``, and ``bf16``.

A compressor turns a tensor into what travels (``compress`` -> ``(tensor, ctx)``) and
back (``decompress(tensor, ctx)``), exactly Horovod's interface
(horovod/torch/compression.py), so user-written compressors plug in unchanged.
``fp16`` / ``bf16``: floating tensors travel as float16 / bfloat16 and come back in their own
dtype; integer tensors are left alone. bfloat16 keeps float32's range (no overflow of large
gradients), float16 keeps more digits; both halve the bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class Compressor(ABC):
    """Interface: subclass and override both static methods."""

    @staticmethod
    @abstractmethod
    def compress(tensor: torch.Tensor):
        """Return (tensor to send, context for decompress)."""

    @staticmethod
    @abstractmethod
    def decompress(tensor: torch.Tensor, ctx):
        """Return the received tensor restored with ``ctx``."""


class NoneCompressor(Compressor):
    """Send tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    """Floating tensors travel as ``wire`` (half the bytes); others untouched."""

    wire = torch.float16

    @classmethod
    def compress(cls, tensor):
        dtype = tensor.dtype
        if dtype.is_floating_point:
            return tensor.type(cls.wire), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None and ctx.is_floating_point and tensor.dtype != ctx:
            return tensor.type(ctx)
        return tensor


class FP16Compressor(_CastCompressor):
    """Floating tensors travel as float16 (half the bytes); others untouched."""

    wire = torch.float16


class BF16Compressor(_CastCompressor):
    """Floating tensors travel as bfloat16 (half the bytes, float32's range); others untouched."""

    wire = torch.bfloat16


class Compression:
    """The compressors by Horovod's names."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
