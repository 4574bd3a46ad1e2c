"""Running the metadata check (or not), including arguments that are wrong on one rank only.

A rank whose own arguments are invalid (a root outside the set, splits that do not
add up) must not simply raise: its peers would then wait in the collective forever.
With checks on it still takes part in the exchange, marked invalid, and every rank
raises — the faulty one with its own message, the others naming it.
"""

from __future__ import annotations

from ..errors import RingtrainError
from . import checks, named
from .checks import (
    INVALID_OP,
    InvalidArgument,  # noqa: F401  (re-exported: raised for invalid arguments)
    Row,
)
from .groups import ProcessSet


def root_problem(root, ps: ProcessSet, what: str, name: str = "dst") -> RingtrainError | None:
    """Why ``root`` cannot be the rank a collective goes to (or from), if it cannot."""
    if isinstance(root, bool) or not isinstance(root, int) or root not in ps.ranks:
        return RingtrainError(f"{what} got {name}={root!r}, which is not a rank of {ps!r}",
                              f"{name} is a rank, one of {ps.ranks}, the same on every rank.")
    return None


def run(ps: ProcessSet, call: checks.Call, enabled: bool, problem: RingtrainError | None = None,
        allow_joined: bool = False) -> list[Row] | None:
    """Check ``call`` across ``ps`` when ``enabled``; return the gathered rows (None when unchecked)."""
    if not enabled or ps.size() == 1:
        if problem is not None:
            raise problem
        return None
    if problem is not None:
        call.op, call.agree = INVALID_OP, "invalid"
    while True:
        rows, started = named.exchange(ps, call)
        # Held named ops started in this round: a rank that was waiting for one may now go on
        # and call what we called; ask again rather than report a mismatch.
        if not (started and _disagree(rows, ps.rank())):
            break
    bad = [i for i, row in enumerate(rows) if row.invalid]
    if problem is not None:
        raise problem
    if bad:
        who = [ps.global_rank(i) for i in bad]
        raise RingtrainError(
            f"rank(s) {who} called {call.kind.name.lower()} with invalid arguments, so no rank ran it",
            f"see the error raised on rank(s) {who}.",
        )
    compare(ps, rows, allow_joined)
    return rows


def _disagree(rows: list[Row], me: int) -> bool:
    mine = rows[me].compared()
    return any(row.compared() != mine for row in rows if not row.joined)


def compare(ps: ProcessSet, rows: list[Row], allow_joined: bool) -> None:
    """Raise unless every active member's descriptor agrees (and joined ranks are allowed)."""
    active = [row for row in rows if row.ours and not row.joined]
    joined = [i for i, row in enumerate(rows) if row.joined]
    reference = active[0]
    if any(not row.ours for row in rows) or any(row.compared() != reference.compared() for row in active):
        raise checks.mismatch(ps, rows)
    if joined and not allow_joined:
        raise joined_error(ps, reference, joined)


def joined_error(ps: ProcessSet, reference: Row, joined: list[int]) -> RingtrainError:
    return RingtrainError(
        f"{checks.describe(reference)} was called while rank(s) {[ps.global_rank(i) for i in joined]} "
        "had already called join(); joined ranks only take part in allreduce and barrier",
        "call join() only after the last collective other than allreduce (as in Horovod).",
    )
