"""Horovod's collectives by Horovod's names, signatures and defaults (horovod/torch/mpi_ops.py, 0.28).

Every function here only translates arguments (deprecated ``average``, process
sets, compression) and hands over to ``ringtrain.comm``; the differentiable forms
go through ``autograd.py``. Async forms return handles for ``poll``/``synchronize``;
a named async op is paired across ranks by its name, as in Horovod (``comm/named.py``),
and reusing a name while its op is in flight raises ``ValueError``.
Tensors need not be contiguous (Horovod requires it; we copy when needed).
"""

from __future__ import annotations

import warnings

import torch

from .. import comm
from ..comm import Compression, Handle
from . import autograd
from .basics import RUNTIME, Average, Sum, global_process_set, require_init, resolve


def _op(op, average):
    """Horovod's ``handle_average_backwards_compatibility``."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    return Average if op is None else op


def _checks() -> bool:
    return RUNTIME.checks


def _named(process_set, name, what: str, launch) -> Handle:
    """Horovod pairs async ops by name: a named one is held until every rank has submitted it."""
    ps = resolve(process_set)
    return comm.submit_named(ps, name, lambda: launch(ps), check=_checks(), what=what)


# --- allreduce ---------------------------------------------------------------------
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set) -> Handle:
    """``allreduce`` started asynchronously: returns a handle for ``poll``/``synchronize``."""
    op = _op(op, average)
    return _named(process_set, name, "allreduce_async", lambda ps: comm.allreduce(
        tensor, op, prescale=prescale_factor, postscale=postscale_factor, process_set=ps, check=_checks(), name=name))


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """Reduce over all ranks (Average by default); differentiable; the input is not modified."""
    op = _op(op, average)
    compressed, ctx = compression.compress(tensor)
    reduced = autograd.Allreduce.apply(compressed, op, prescale_factor, postscale_factor, resolve(process_set), name)
    return compression.decompress(reduced, ctx)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set) -> Handle:
    """``allreduce_`` started asynchronously: returns a handle for ``poll``/``synchronize``."""
    op = _op(op, average)
    return _named(process_set, name, "allreduce_async_", lambda ps: comm.allreduce(
        tensor, op, prescale=prescale_factor, postscale=postscale_factor, process_set=ps, inplace=True,
        check=_checks(), name=name))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """``allreduce`` in place: the result is written into ``tensor``, which is returned."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set) -> Handle:
    """``grouped_allreduce`` started asynchronously: returns a handle."""
    op = _op(op, average)
    return _named(process_set, name, "grouped_allreduce_async", lambda ps: comm.grouped_allreduce(
        tensors, op, prescale=prescale_factor, postscale=postscale_factor, process_set=ps, check=_checks(), name=name))


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """``allreduce`` of a list of tensors as one operation; returns the reduced list."""
    op = _op(op, average)
    if not tensors:
        return []
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    reduced = autograd.GroupedAllreduce.apply(op, prescale_factor, postscale_factor, resolve(process_set), name,
                                              *compressed)
    return [compression.decompress(t, ctx) for t, ctx in zip(reduced, ctxs)]


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set) -> Handle:
    """``grouped_allreduce_`` started asynchronously: returns a handle."""
    op = _op(op, average)
    return _named(process_set, name, "grouped_allreduce_async_", lambda ps: comm.grouped_allreduce(
        tensors, op, prescale=prescale_factor, postscale=postscale_factor, process_set=ps, inplace=True,
        check=_checks(), name=name))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    """``grouped_allreduce`` in place: each tensor of the list receives its result."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


class SparseHandle(Handle):
    """Horovod returns a function for sparse allreduces (``handle()`` waits and gives the result);
    this handle is that function and still works with ``poll``/``synchronize``."""

    __slots__ = ()

    def __call__(self):
        return self.wait()


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set) -> SparseHandle:
    """Horovod's sparse path: allgather indices and values (Average divides the values)."""
    ps = resolve(process_set)
    t = tensor if tensor.is_sparse else tensor.to_sparse()
    # Allgather concatenates along dim 0: indices travel transposed, one row per non-zero.
    indices = allgather_async(t._indices().transpose(0, 1).contiguous(), name=f"{name}.indices", process_set=ps)
    values = allgather_async(t._values(), name=f"{name}.values", process_set=ps)

    def finish():
        gathered_values = values.wait()
        gathered_indices = indices.wait()
        if op == Average:
            gathered_values = gathered_values / ps.size()
        if gathered_indices.dim() == 0 or gathered_values.dim() == 0:
            return torch.sparse_coo_tensor().to(tensor.device)
        return torch.sparse_coo_tensor(gathered_indices.transpose(0, 1), gathered_values, t.size())

    return SparseHandle([indices, values], finish, what="sparse allreduce")


# --- allgather, broadcast, alltoall, reducescatter ------------------------------------
def allgather_async(tensor, name=None, process_set=global_process_set) -> Handle:
    """``allgather`` started asynchronously: returns a handle for ``poll``/``synchronize``."""
    return _named(process_set, name, "allgather_async",
                  lambda ps: comm.allgather(tensor, process_set=ps, check=_checks(), name=name))


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenate every rank's tensor along dim 0 (first dimensions may differ); differentiable."""
    return autograd.Allgather.apply(tensor, resolve(process_set), name)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> Handle:
    """``grouped_allgather`` started asynchronously: returns a handle."""
    return _named(process_set, name, "grouped_allgather_async",
                  lambda ps: comm.grouped_allgather(tensors, process_set=ps, check=_checks(), name=name))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """``allgather`` of a list of tensors as one operation; returns the gathered list."""
    return [allgather(t, name, process_set) for t in tensors]


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """``broadcast`` started asynchronously: returns a handle for ``poll``/``synchronize``."""
    return _named(process_set, name, "broadcast_async",
                  lambda ps: comm.broadcast(tensor, root_rank, process_set=ps, check=_checks(), name=name))


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Rank ``root_rank``'s tensor on every rank, as a new tensor; differentiable."""
    return autograd.Broadcast.apply(tensor, root_rank, resolve(process_set), name)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """``broadcast_`` started asynchronously: returns a handle."""
    return _named(process_set, name, "broadcast_async_", lambda ps: comm.broadcast(
        tensor, root_rank, process_set=ps, inplace=True, check=_checks(), name=name))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """``broadcast`` in place: ``tensor`` receives ``root_rank``'s values and is returned."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> Handle:
    """``alltoall`` started asynchronously: returns a handle for ``poll``/``synchronize``."""
    return _named(process_set, name, "alltoall_async",
                  lambda ps: comm.alltoall(tensor, splits, process_set=ps, check=_checks(), name=name))


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatter rows to every rank and gather theirs; with ``splits``, also return the received splits."""
    output, received = autograd.Alltoall.apply(tensor, splits, resolve(process_set), name)
    return output if splits is None else (output, received)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0) -> Handle:
    """``reducescatter`` started asynchronously: returns a handle for ``poll``/``synchronize``."""
    return _named(process_set, name, "reducescatter_async", lambda ps: comm.reducescatter(
        tensor, op, prescale=prescale_factor, postscale=postscale_factor, process_set=ps, check=_checks(), name=name))


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce, then give rank i its block of rows (the first ``rows % size`` ranks get one more)."""
    compressed, ctx = compression.compress(tensor)
    reduced = autograd.Reducescatter.apply(compressed, op, prescale_factor, postscale_factor, resolve(process_set),
                                           name)
    return compression.decompress(reduced, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    """``grouped_reducescatter`` started asynchronously: returns a handle."""
    return _named(process_set, name, "grouped_reducescatter_async", lambda ps: comm.grouped_reducescatter(
        tensors, op, prescale=prescale_factor, postscale=postscale_factor, process_set=ps, check=_checks(), name=name))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """``reducescatter`` of a list of tensors as one operation; returns the list of this rank's parts."""
    return [reducescatter(t, name, compression, op, process_set, prescale_factor, postscale_factor) for t in tensors]


# --- handles and synchronisation -------------------------------------------------------
def poll(handle: Handle) -> bool:
    """True when the operation behind ``handle`` has finished (``synchronize`` will not block)."""
    return handle.poll()


def synchronize(handle: Handle):
    """Wait for an async operation; return its output (a tuple for alltoall)."""
    return handle.wait()


def join(device=-1) -> int:
    """This rank is out of data: take part with zeros in the others' allreduces until all join.

    Returns the rank that joined last. ``device``: where zero CUDA tensors go (-1 = current).
    """
    require_init()
    where = torch.device("cuda", device) if isinstance(device, int) and device >= 0 else None
    return comm.join(process_set=global_process_set, check=_checks(), device=where)


def barrier(process_set=global_process_set) -> None:
    """Wait until every rank of the process set has reached this call."""
    comm.barrier(process_set=resolve(process_set), check=_checks())
