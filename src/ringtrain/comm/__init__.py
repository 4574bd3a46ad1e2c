"""Communication machinery on torch.distributed that more than one strategy uses.

The Horovod-compatible API (``ringtrain.horovod``) and the ``hvd`` strategy are two
faces on this one core (docs/architecture.md: "horovod/ is a face, not a second core"):

* ``reduce`` / ``move`` / ``join`` — checked collectives returning :class:`Handle`\\ s:
  allreduce (fused groups, Adasum), reducescatter, allgather (uneven), broadcast,
  alltoall, barrier, join; every dtype Horovod accepts, bytes moved faithfully.
* ``checks`` — the per-collective metadata check that turns a mismatch into an
  error on every rank instead of a hang.
* ``named`` — asynchronous ops paired across ranks by name (Horovod's rule), held
  until every rank has submitted them; duplicate names in flight raise ValueError.
* ``groups`` — process sets.
* ``grad_sync`` / ``optimizer`` — gradient hooks with fusion buckets, compression,
  backward_passes_per_step, and the DistributedOptimizer (Adasum delta variant too).
* ``state`` — broadcasting parameters, optimizer state and Python objects.
"""

from .adasum import combine as adasum_combine
from .compression import BF16Compressor, Compression, Compressor, FP16Compressor, NoneCompressor
from .grad_sync import DEFAULT_FUSION_THRESHOLD, GradientSync
from .groups import GLOBAL, ProcessSet, ProcessSetTable
from .handles import CollectiveFailure, Handle
from .join import barrier, join
from .move import allgather, alltoall, broadcast, gather_to, grouped_allgather
from .named import DuplicateName, Held, submit as submit_named
from .ops import ReduceOp
from .optimizer import distributed_optimizer, is_distributed, local_step
from .reduce import allreduce, grouped_allreduce, grouped_reducescatter, reduce_to, reducescatter, split_rows
from .state import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters, initialize_state

__all__ = [
    "BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor", "DEFAULT_FUSION_THRESHOLD", "GradientSync",
    "GLOBAL", "ProcessSet", "ProcessSetTable", "CollectiveFailure", "Handle", "ReduceOp", "adasum_combine",
    "allreduce", "grouped_allreduce", "reducescatter", "grouped_reducescatter", "split_rows",
    "allgather", "grouped_allgather", "broadcast", "alltoall", "barrier", "join", "reduce_to", "gather_to",
    "DuplicateName", "Held", "submit_named",
    "distributed_optimizer", "is_distributed", "local_step", "initialize_state",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object",
]
