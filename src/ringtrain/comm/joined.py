"""A joined rank's part in the rounds the active ranks still run.

After ``join()`` (join.py) a rank keeps taking part in check rounds; each round's rows say
what the active ranks run, and ``serve`` takes part in it with zeros where joined ranks
may (allreduce, a newly verified gradient layout). It lives apart from join.py because
named.py needs it too — a joined rank serves while held named ops start — and join.py
uses named.py: here both import it, and neither imports the other's caller.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import checks
from .checks import Kind, Row
from .groups import ProcessSet
from .ops import CODE_DTYPE, ReduceOp, wire


def serve(rows: list[Row], ps: ProcessSet, device=None, mirror=None) -> None:
    """A joined rank's part in what the active ranks run now (described by ``rows``).

    Allreduces get zeros, a newly verified gradient layout gets zero buckets posted;
    anything else is the active ranks' error to raise — invalid arguments, mismatched
    calls, or an op joined ranks cannot take part in — and this rank, as in Horovod,
    just keeps waiting for the next round. ``mirror`` (join.py's ``_Mirror``) keeps the
    zero gradient buckets of the verified layout posted; without one, layouts are not followed.
    """
    active = [row for row in rows if not row.joined]
    reference = active[0]
    if any(not row.ours or row.invalid for row in active) or any(
            row.compared() != reference.compared() for row in active):
        return
    if reference.kind == Kind.ALLREDUCE:
        _zeros_allreduce(reference, ps, device)
    elif reference.kind == Kind.GRAD_SYNC and mirror is not None:
        mirror.switch(reference.agree)  # a gradient sync's agree hash is its layout hash


def _zeros_allreduce(row: Row, ps: ProcessSet, device) -> None:
    code, numel = row.dtype, row.aux
    dtype = CODE_DTYPE[code % checks.CUDA_FLAG]
    if code >= checks.CUDA_FLAG:
        where = device or torch.device("cuda", torch.cuda.current_device())
    else:
        where = torch.device("cpu")
    wire_dtype, engine_op = wire(dtype, ReduceOp(row.op))
    if numel:
        zeros = torch.zeros(numel, dtype=wire_dtype, device=where)
        dist.all_reduce(zeros, op=engine_op, group=ps.group_for(zeros))
