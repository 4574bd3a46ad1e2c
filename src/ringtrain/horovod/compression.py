"""``hvd.Compression``: the core's compressors under Horovod's module name."""

from ..comm.compression import BF16Compressor, Compression, Compressor, FP16Compressor, NoneCompressor

__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
