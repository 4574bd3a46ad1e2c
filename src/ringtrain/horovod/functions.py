"""Horovod's state-broadcasting helpers (horovod/torch/functions.py), on ``ringtrain.comm.state``."""

from __future__ import annotations

from .. import comm
from .basics import RUNTIME, global_process_set, resolve


def broadcast_parameters(params, root_rank, *, process_set=global_process_set) -> None:
    """Overwrite ``params`` (``model.state_dict()``, ``named_parameters()`` or ``parameters()``) with the root's."""
    comm.broadcast_parameters(params, root_rank, process_set=resolve(process_set), check=RUNTIME.checks)


def broadcast_optimizer_state(optimizer, root_rank, model=None, *, process_set=global_process_set) -> None:
    """Make every rank's optimizer state (tensors, step counts, learning rates ...) the root's.

    As in Horovod, a fresh optimizer (empty state) is first initialised by one local step on
    zero gradients (``model`` tells which parameters take sparse gradients); then the root's
    whole state is loaded everywhere.
    """
    comm.initialize_state(optimizer, model)
    comm.broadcast_optimizer_state(optimizer, root_rank, process_set=resolve(process_set), check=RUNTIME.checks)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """The root's picklable ``obj`` on every rank (cloudpickle when installed, as in Horovod)."""
    return comm.broadcast_object(obj, root_rank, process_set=resolve(process_set), check=RUNTIME.checks, name=name)


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Every rank's picklable ``obj``, as a list in rank order."""
    return comm.allgather_object(obj, process_set=resolve(process_set), check=RUNTIME.checks, name=name)
