"""``barrier`` and ``join``: synchronisation points, and finishing with uneven data.

``join()`` (Horovod 0.17+): a rank that has run out of data calls it and then
takes part, with zeros, in every allreduce the other ranks still run — their
gradient averages keep flowing — until every rank has joined; it returns the rank
that joined last. Joined ranks learn what the others run from the metadata check's
descriptors, so ``join`` needs checks on (the default). As in Horovod, only
allreduce (including the DistributedOptimizer's gradient buckets) and barrier may
run while some ranks have joined; anything else raises on the ranks that called it,
while the joined ranks keep waiting in ``join()`` (so the others can still join). Averages
keep dividing by the full set size, like DDP's join (``divide_by_initial_world_size``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import RingtrainError
from . import checks, named, validate
from .checks import Call, Kind
from .groups import ProcessSet
from .ops import CODE_DTYPE, ReduceOp, wire

# Mirrors for composite operations whose descriptor names a registered object
# (grad_sync registers its gradient buckets here): kind -> fn(row, process_set).
MIRRORS: dict = {}


def barrier(*, process_set: ProcessSet, check: bool = True) -> None:
    process_set.require_member("barrier")
    if process_set.size() == 1:
        return
    if check:
        # The check's all_gather is itself a barrier: nobody leaves before everybody arrived.
        named.barrier(process_set)
        return
    dist.barrier(group=process_set.group_for(None))


def join(*, process_set: ProcessSet, check: bool = True, device=None) -> int:
    """Mark this rank as done; serve the others' allreduces with zeros until all have joined."""
    process_set.require_member("join")
    if process_set.size() == 1:
        return process_set.global_rank(0)
    if not check:
        raise RingtrainError(
            "join() was called with the collective checks turned off; joined ranks learn what to take part "
            "in from the checks",
            "leave checks on (the default) in jobs that use join().",
        )
    joined_at = process_set.check_rounds
    while True:
        rows, _ = named.exchange(process_set, Call(Kind.JOIN, aux=joined_at))
        if all(row[0] == checks.MAGIC and row[1] == Kind.JOIN for row in rows):
            last = max(range(len(rows)), key=lambda i: (rows[i][15], i))
            return process_set.global_rank(last)
        serve(rows, process_set, device)


def serve(rows: list[list[int]], ps: ProcessSet, device=None) -> None:
    """A joined rank's part in what the active ranks run now (described by ``rows``).

    Allreduces (and gradient buckets) get zeros; anything else is the active ranks' error
    to raise — invalid arguments, mismatched calls, or an op joined ranks cannot take part
    in — and this rank, as in Horovod, just keeps waiting for the next round.
    """
    active = [row for row in rows if row[0] != checks.MAGIC or row[1] != Kind.JOIN]
    reference = active[0]
    if any(row[0] != checks.MAGIC or row[3] == validate.INVALID_OP for row in active) or any(
            row[f] != reference[f] for row in active for f in checks.COMPARED):
        return
    kind = reference[1]
    if kind == Kind.ALLREDUCE:
        _zeros_allreduce(reference, ps, device)
    elif kind in MIRRORS:
        MIRRORS[kind](reference, ps)


def _zeros_allreduce(row: list[int], ps: ProcessSet, device) -> None:
    code, numel = row[2], row[15]
    dtype = CODE_DTYPE[code % checks.CUDA_FLAG]
    if code >= checks.CUDA_FLAG:
        where = device or torch.device("cuda", torch.cuda.current_device())
    else:
        where = torch.device("cpu")
    wire_dtype, engine_op = wire(dtype, ReduceOp(row[3]))
    if numel:
        zeros = torch.zeros(numel, dtype=wire_dtype, device=where)
        dist.all_reduce(zeros, op=engine_op, group=ps.group_for(zeros))
