"""Horovod's PyTorch API on torch.distributed — ``import ringtrain.horovod as hvd``.

A Horovod script runs unchanged, with nothing to compile: the same names,
signatures, defaults and semantics as ``horovod.torch`` 0.28 (the last release),
implemented on ``ringtrain.comm`` (Gloo on CPU, NCCL on GPU). Under
``ringtrain run --horovod`` the name ``horovod.torch`` itself resolves here
(``_alias/`` is put on the workers' PYTHONPATH; nothing is installed).

    import ringtrain.horovod as hvd
    hvd.init()
    torch.cuda.set_device(hvd.local_rank())          # on GPUs
    sampler = DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.fp16, op=hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

Differences worth knowing: collectives are matched by call order, except named async ops (paired by name, as Horovod does; a
metadata check raises on every rank when ranks disagree; ``RINGTRAIN_HVD_CHECKS=0``
turns it off); the timeline (``start_timeline``, ``HOROVOD_TIMELINE``) is ringtrain's: one Chrome trace with
a lane per rank, each gradient bucket's all-reduce and the optimizer steps (ringtrain/tracking/timeline.py), not
Horovod's per-tensor negotiation states; elastic mode covers a fixed host set.
"""

from ..comm.groups import ProcessSet
from . import elastic
from .basics import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    add_process_set,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from .compression import Compression
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .mpi_ops import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from .optimizer import DistributedOptimizer
from .sync_batch_norm import SyncBatchNorm

__version__ = "0.28.1"

__all__ = [
    "elastic", "Compression", "HorovodInternalError", "HostsUpdatedInterrupt",
    "allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters",
    "allreduce", "allreduce_async", "allreduce_", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_async", "grouped_allreduce_", "grouped_allreduce_async_",
    "sparse_allreduce_async", "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_async", "broadcast_", "broadcast_async_", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "join", "barrier", "poll", "synchronize", "init", "shutdown", "is_initialized", "start_timeline",
    "stop_timeline", "size", "local_size", "cross_size", "rank", "local_rank", "cross_rank", "is_homogeneous",
    "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built",
    "ccl_built", "cuda_built", "rocm_built", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "Average", "Sum", "Adasum", "Min", "Max", "Product", "DistributedOptimizer",
    "SyncBatchNorm",
]
