"""The metadata check: every rank says what it is about to run, before running it.

A collective called with different shapes, dtypes, ops or roots on different ranks
either hangs (sizes differ, so the engine waits for bytes that never come) or
returns garbage. Horovod's coordinator catches this by negotiating every tensor by
name; here each collective is preceded by one small ``all_gather`` of a fixed-size
int64 descriptor per rank (``Row``, WIDTH numbers), compared on every rank. The check itself
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
from typing import NamedTuple

import torch

from ..errors import RingtrainError
from .groups import ProcessSet
from .handles import Handle
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


CUDA_FLAG = 1000
# The op code of a rank whose own arguments were invalid: it still takes part in the round,
# so its peers raise too instead of waiting in a collective it will never run (validate.py).
INVALID_OP = -9


class Row(NamedTuple):
    """One rank's descriptor, as every rank reads it after the exchange.

    On the wire a row is WIDTH plain int64 (one all_gather of a flat tensor, or JSON through
    the store in debug mode); ``wire()`` and ``parse()`` are the only places that know the
    positions. A row whose ``magic`` is not MAGIC was not written by a check (a raw
    torch.distributed call met ours); its other fields are then meaningless.
    """

    magic: int
    kind: int  # a Kind
    dtype: int  # ops.dtype_code, + CUDA_FLAG on CUDA; 0 = no tensor
    op: int  # a ReduceOp, INVALID_OP, or -1
    root: int  # -1 = none
    ndim: int
    dims: tuple  # the first _DIMS dims, padded with -1 (shown in messages; the full shape is in ``agree``)
    agree: int  # hash of everything else that must agree (full shape, scale factors, layout)
    aux: int  # allgather's first dim, allreduce's numel, join round, gradient buckets
    held: int  # number of named ops this rank holds (named.py)
    held_digest: int  # digest of their names (named.py)

    @classmethod
    def parse(cls, values) -> "Row":
        """A row from its WIDTH ints on the wire."""
        values = [int(v) for v in values]
        return cls(*values[:6], tuple(values[6:6 + _DIMS]), *values[6 + _DIMS:])

    def wire(self) -> list[int]:
        """The WIDTH ints that travel: magic, kind, dtype, op, root, ndim, 8 dims, agree, aux, held, digest."""
        return [*self[:6], *self.dims, *self[7:]]

    @property
    def ours(self) -> bool:
        """Written by a metadata check (not by a raw collective that met ours)."""
        return self.magic == MAGIC

    @property
    def joined(self) -> bool:
        """The rank has called join() and only serves the others."""
        return self.ours and self.kind == Kind.JOIN

    @property
    def invalid(self) -> bool:
        """The rank's own arguments were invalid: it raises, and so must everyone else."""
        return self.ours and self.op == INVALID_OP

    def compared(self) -> tuple:
        """What every active rank's row must match (everything but dims, aux and the named-op fields)."""
        return (self.magic, self.kind, self.dtype, self.op, self.root, self.ndim, self.agree)


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


def _encode(call: Call) -> Row:
    code = dtype_code(call.dtype) if call.dtype is not None else 0
    if call.device == "cuda":
        code += CUDA_FLAG
    dims = list(call.shape)[:_DIMS] + [-1] * (_DIMS - min(len(call.shape), _DIMS))
    return Row(MAGIC, int(call.kind), code, int(call.op), int(call.root), len(call.shape), tuple(int(d) for d in dims),
               hash_text(call.agree), int(call.aux), int(call.held), int(call.held_digest))


def _parse(rows: list[list[int]]) -> list[Row]:
    """Rows from the wire (what a checker received)."""
    return [Row.parse(values) for values in rows]


class GatherRows:
    """The default way descriptors travel: one all_gather of WIDTH int64 per rank.

    One checker interface, two implementations: this one (cheap, in the engine) and
    ``store_check.StoreRows`` (debug: through the rendezvous store, with a timeout, so a
    rank that never arrives is named instead of waited for). A process set's ``checker``
    says which; both take this rank's Row and return every member's, in set-rank order,
    moving them as ``Row.wire()`` ints.
    """

    def exchange(self, ps: ProcessSet, row: Row) -> list[Row]:
        mine = torch.tensor(row.wire(), dtype=torch.int64)
        rows = torch.empty(ps.size() * WIDTH, dtype=torch.int64)
        all_gather_flat(rows, mine, group=ps.group_for(None))
        return _parse(rows.view(ps.size(), WIDTH).tolist())

    def exchange_async(self, ps: ProcessSet, row: Row) -> Handle:
        mine = torch.tensor(row.wire(), dtype=torch.int64)
        rows = torch.empty(ps.size() * WIDTH, dtype=torch.int64)
        work = all_gather_flat(rows, mine, group=ps.group_for(None), async_op=True)
        return Handle([work], lambda: _parse(rows.view(ps.size(), WIDTH).tolist()), what="metadata check")


GATHER = GatherRows()


def exchange(ps: ProcessSet, call: Call) -> list[Row]:
    """Every member's descriptor, in set-rank order (through the set's checker)."""
    ps.check_rounds += 1
    return (ps.checker or GATHER).exchange(ps, _encode(call))


def exchange_async(ps: ProcessSet, call: Call) -> Handle:
    """``exchange`` without waiting: a Handle whose result is the rows."""
    ps.check_rounds += 1
    checker = ps.checker or GATHER
    if hasattr(checker, "exchange_async"):
        return checker.exchange_async(ps, _encode(call))
    return Handle.completed(checker.exchange(ps, _encode(call)), what="metadata check")


def describe(row: Row) -> str:
    if not row.ours:
        return "something that is not a ringtrain collective (a raw torch.distributed call?)"
    kind = Kind(row.kind)
    if kind == Kind.JOIN:
        return "join()"
    if kind == Kind.BARRIER:
        return "barrier()"
    if kind == Kind.WAIT:
        return "synchronize() of a named op not yet submitted everywhere"
    if kind == Kind.SETTLED:
        return "starting named ops"
    device = "cuda " if row.dtype >= CUDA_FLAG else ""
    dtype = CODE_DTYPE.get(row.dtype % CUDA_FLAG)
    dtype_name = str(dtype).replace("torch.", "") if dtype is not None else "?"
    dims = [str(d) for d in row.dims[:min(row.ndim, _DIMS)]] + (["..."] if row.ndim > _DIMS else [])
    text = f"{kind.name.lower()}({device}{dtype_name}[{', '.join(dims)}]"
    if row.invalid:
        return text + ", invalid arguments)"
    if row.op >= 0:
        text += f", op={ReduceOp(row.op).name.title()}"
    if row.root >= 0:
        text += f", root_rank={row.root}"
    if kind == Kind.GRAD_SYNC:
        text += f", {row.aux} bucket(s)"
    return text + ")"


def mismatch(ps: ProcessSet, rows: list[Row]) -> RingtrainError:
    worded = getattr(ps.checker, "mismatch", None)
    if worded is not None:  # the debug checker knows each rank's call in its caller's words
        return worded(ps)
    return _mismatch(ps, rows)


def _mismatch(ps: ProcessSet, rows: list[Row]) -> RingtrainError:
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
