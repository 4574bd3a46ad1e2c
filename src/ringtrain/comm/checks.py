"""The metadata check: every rank says what it is about to run, before running it.

A collective called with different shapes, dtypes, ops or roots on different ranks
either hangs (sizes differ, so the engine waits for bytes that never come) or
returns garbage. Horovod's coordinator catches this by negotiating every tensor by
name; here each collective is preceded by one small ``all_gather`` of a fixed-size
int64 descriptor per rank (16 numbers), compared on every rank. The check itself
has the same shape whatever was asked for, so it cannot hang on a mismatch, and
since every rank sees the same gathered rows, every rank raises the same error.

The descriptors also carry what some collectives need anyway — the first
dimension of each rank's allgather input, who has called ``join()``, how many
named ops each rank holds (named.py) — so with checks on, an uneven allgather
costs no extra round trip.

Checks run on the process set's CPU-capable group (Gloo, or the Gloo twin under
NCCL) with CPU tensors, whatever device the data is on — or, in debug mode
(``Ring(debug_collectives=...)``, ``RINGTRAIN_DEBUG_COLLECTIVES=1``), through the rendezvous
store with a timeout (store_check.py), which names a rank that never arrives.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

import torch

from ..errors import RingtrainError
from .groups import ProcessSet
from .ops import CODE_DTYPE, ReduceOp, all_gather_flat, dtype_code

WIDTH = 18
MAGIC = 0x52494E47  # "RING": a row without it was not written by a check
_DIMS = 8  # dims shown in messages; the full shape is in the hash


class Kind(enum.IntEnum):
    ALLREDUCE = 1
    ALLGATHER = 2
    BROADCAST = 3
    ALLTOALL = 4
    REDUCESCATTER = 5
    BARRIER = 6
    ADASUM = 7
    GRAD_SYNC = 8
    JOIN = 9
    WAIT = 10  # waiting for a held named op to start (named.py)
    SETTLED = 11  # held ops started; joined ranks stop serving (named.py)
    REDUCE = 12  # to one rank (ringtrain's ring.reduce; torch's dist.reduce)
    GATHER = 13  # to one rank (ring.gather; dist.gather)


# Fields: 0 magic, 1 kind, 2 dtype (+1000 on CUDA), 3 op, 4 root, 5 ndim, 6..13 dims,
# 14 hash of everything that must agree, 15 aux (allgather rows, join round, buckets),
# 16 number of named ops this rank holds, 17 digest of their names (named.py).
COMPARED = (0, 1, 2, 3, 4, 5, 14)
HELD, HELD_DIGEST = 16, 17
CUDA_FLAG = 1000


class InvalidArgument(RingtrainError, ValueError):
    """Arguments a collective rejects before running, where Horovod raises ``ValueError``
    (its ``Status::InvalidArgument``) — still a RingtrainError with a hint."""


@dataclass
class Call:
    """What this rank is about to run."""

    kind: Kind
    dtype: torch.dtype | None = None
    device: str = "cpu"
    op: int = -1
    root: int = -1
    shape: tuple = ()
    agree: str = ""  # anything else every rank must match (full shape, scale factors, layout)
    aux: int = 0
    name: str | None = None
    held: int = 0
    held_digest: int = 0


def hash_text(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def _encode(call: Call) -> list[int]:
    code = dtype_code(call.dtype) if call.dtype is not None else 0
    if call.device == "cuda":
        code += CUDA_FLAG
    dims = list(call.shape)[:_DIMS] + [-1] * (_DIMS - min(len(call.shape), _DIMS))
    return [MAGIC, int(call.kind), code, int(call.op), int(call.root), len(call.shape), *dims,
            hash_text(call.agree), int(call.aux), int(call.held), int(call.held_digest)]


class GatherRows:
    """The default way descriptors travel: one all_gather of WIDTH int64 per rank.

    One checker interface, two implementations: this one (cheap, in the engine) and
    ``store_check.StoreRows`` (debug: through the rendezvous store, with a timeout, so a
    rank that never arrives is named instead of waited for). A process set's ``checker``
    says which; both return every member's row, in set-rank order.
    """

    def exchange(self, ps: ProcessSet, row: list[int]) -> list[list[int]]:
        mine = torch.tensor(row, dtype=torch.int64)
        rows = torch.empty(ps.size() * WIDTH, dtype=torch.int64)
        all_gather_flat(rows, mine, group=ps.group_for(None))
        return rows.view(ps.size(), WIDTH).tolist()

    def exchange_async(self, ps: ProcessSet, row: list[int]):
        from .handles import Handle

        mine = torch.tensor(row, dtype=torch.int64)
        rows = torch.empty(ps.size() * WIDTH, dtype=torch.int64)
        work = all_gather_flat(rows, mine, group=ps.group_for(None), async_op=True)
        return Handle([work], lambda: rows.view(ps.size(), WIDTH).tolist(), what="metadata check")


GATHER = GatherRows()


def exchange(ps: ProcessSet, call: Call) -> list[list[int]]:
    """Every member's descriptor, in set-rank order (through the set's checker)."""
    ps.check_rounds += 1
    return (ps.checker or GATHER).exchange(ps, _encode(call))


def exchange_async(ps: ProcessSet, call: Call):
    """``exchange`` without waiting: a Handle whose result is the rows."""
    ps.check_rounds += 1
    checker = ps.checker or GATHER
    if hasattr(checker, "exchange_async"):
        return checker.exchange_async(ps, _encode(call))
    from .handles import Handle

    return Handle.completed(checker.exchange(ps, _encode(call)), what="metadata check")


def describe(row: list[int]) -> str:
    if row[0] != MAGIC:
        return "something that is not a ringtrain collective (a raw torch.distributed call?)"
    kind = Kind(row[1])
    if kind == Kind.JOIN:
        return "join()"
    if kind == Kind.BARRIER:
        return "barrier()"
    if kind == Kind.WAIT:
        return "synchronize() of a named op not yet submitted everywhere"
    if kind == Kind.SETTLED:
        return "starting named ops"
    code = row[2]
    device = "cuda " if code >= CUDA_FLAG else ""
    dtype = CODE_DTYPE.get(code % CUDA_FLAG)
    dtype_name = str(dtype).replace("torch.", "") if dtype is not None else "?"
    ndim = row[5]
    dims = [str(d) for d in row[6:6 + min(ndim, _DIMS)]] + (["..."] if ndim > _DIMS else [])
    text = f"{kind.name.lower()}({device}{dtype_name}[{', '.join(dims)}]"
    if row[3] == -9:
        return text + ", invalid arguments)"
    if row[3] >= 0:
        text += f", op={ReduceOp(row[3]).name.title()}"
    if row[4] >= 0:
        text += f", root_rank={row[4]}"
    if kind == Kind.GRAD_SYNC:
        text += f", {row[15]} bucket(s)"
    return text + ")"


def mismatch(ps: ProcessSet, rows: list[list[int]]) -> RingtrainError:
    worded = getattr(ps.checker, "mismatch", None)
    if worded is not None:  # the debug checker knows each rank's call in its caller's words
        return worded(ps)
    return _mismatch(ps, rows)


def _mismatch(ps: ProcessSet, rows: list[list[int]]) -> RingtrainError:
    lines = "\n".join(f"    rank {ps.global_rank(i)}: {describe(row)}" for i, row in enumerate(rows))
    where = "all ranks" if ps.is_global else f"process set {ps.ranks}"
    return RingtrainError(
        f"ranks called mismatched collectives (on {where}); each asked for:\n{lines}\n"
        "(the same shape everywhere is needed, except the first dimension of allgather/alltoall inputs)",
        "every rank must call the same collectives in the same order with the same dtype, shape, op and "
        "root rank; look for a branch on the rank or on data that differs per rank. The check costs one "
        "small message per collective; turn it off with hvd.init(checks=False) or RINGTRAIN_HVD_CHECKS=0 "
        "only once the job runs.",
    )
