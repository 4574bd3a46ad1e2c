"""``hvd.Compression``: the core's compressors under Horovod's module name."""

from ..comm.compression import Compression, Compressor, FP16Compressor, NoneCompressor

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
