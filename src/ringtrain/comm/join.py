"""``barrier`` and ``join``: synchronisation points, and finishing with uneven data.

``join()`` (Horovod 0.17+): a rank that has run out of data calls it and then
takes part, with zeros, in every allreduce the other ranks still run — their
gradient averages keep flowing — until every rank has joined; it returns the rank
that joined last. Joined ranks learn what the others run from the metadata check's
descriptors, so ``join`` needs checks on (the default). As in Horovod, only
allreduce (including the DistributedOptimizer's gradient buckets) and barrier may
run while some ranks have joined; anything else raises on every rank. Averages
keep dividing by the full set size, like DDP's join (``divide_by_initial_world_size``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import RingtrainError
from . import checks, validate
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
        validate.run(process_set, Call(Kind.BARRIER), True, allow_joined=True)
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
        rows = checks.exchange(process_set, Call(Kind.JOIN, aux=joined_at))
        active = [i for i, row in enumerate(rows) if row[0] != checks.MAGIC or row[1] != Kind.JOIN]
        if not active:
            last = max(range(len(rows)), key=lambda i: (rows[i][15], i))
            return process_set.global_rank(last)
        bad = [process_set.global_rank(i) for i in active if rows[i][3] == validate.INVALID_OP]
        if bad:  # the others raise now; so must we, or we would wait for them forever
            raise RingtrainError(
                f"while this rank was joined, rank(s) {bad} called a collective with invalid arguments",
                f"see the error raised on rank(s) {bad}.",
            )
        reference = rows[active[0]]
        if any(rows[i][0] != checks.MAGIC or any(rows[i][f] != reference[f] for f in checks.COMPARED)
               for i in active):
            raise checks.mismatch(process_set, rows)
        kind = reference[1]
        if kind == Kind.BARRIER:
            continue
        if kind == Kind.ALLREDUCE:
            _zeros_allreduce(reference, process_set, device)
        elif kind in MIRRORS:
            MIRRORS[kind](reference, process_set)
        else:
            joined = [i for i, row in enumerate(rows) if row[0] == checks.MAGIC and row[1] == Kind.JOIN]
            raise validate.joined_error(process_set, reference, joined)


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
