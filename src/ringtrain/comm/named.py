"""Asynchronous collectives paired across ranks by name, as Horovod pairs them.

Horovod queues every op without waiting, and its coordinator starts an op once every
rank has queued one of that name — ranks may submit named ops in different orders,
around barriers and other collectives. A name may not be reused while an op of that
name is still in flight (``ValueError``). The engine here (torch.distributed) pairs
calls by order instead, so a named asynchronous op (with checks on) is *held*, not
started, and is started by name, in the same order on every rank, at the next
metadata-check round that finds it held on every active rank:

* every check round (``exchange``) carries, besides the descriptor of the collective
  being called, how many named ops this rank holds and a digest of their names;
* when every active rank holds some, the held names are compared (one more small
  exchange when the digests differ, or when some ranks have joined), and the ones held
  everywhere are started, sorted by name — each with its own check, so a name used
  for different tensors on different ranks still raises on every rank (into the op's
  handle, as Horovod reports per-op failures);
* waiting on a held op's handle runs check rounds (``WAIT``) until it has started; if
  no rank can make progress (everyone waits for names that others have not submitted)
  every rank raises instead of hanging. A round that started held ops while ranks
  disagree about what they called is repeated, since a waiting rank may now go on.

Unnamed ops, synchronous ops, and everything with checks off start at once, paired
by call order, as before. Joined ranks take part in held allreduces with zeros.
"""

from __future__ import annotations

import torch

from ..errors import RingtrainError
from ..liveness.activity import waits_for_peers
from . import checks
from .checks import Call, InvalidArgument, Kind, Row, hash_text
from .groups import ProcessSet
from .handles import Handle
from .joined import serve
from .ops import all_gather_flat


class DuplicateName(InvalidArgument):
    """A name reused while an op of that name is in flight (Horovod raises ValueError)."""


class NamedOps:
    """This rank's named ops on one process set: held until paired by name, and names in flight.

    Owned here and kept by the set (``ProcessSet.part``), which calls ``clear()`` when it is
    removed or Horovod shuts down.
    """

    def __init__(self) -> None:
        self.held: dict[str, Held] = {}  # not started yet, by name
        self.inflight: dict[str, Handle] = {}  # every named op not known to be done, by name
        self.inflight_sweep = 256  # forget finished names once this many are recorded
        self.settling = False  # inside a round that starts held ops (no held ops described meanwhile)

    def clear(self) -> None:
        """Drop held ops and names (``shutdown``, a removed set); waiting on a dropped op raises."""
        for held in self.held.values():
            held.error = RingtrainError(f"{held.what} {held.name!r} was never started: Horovod was shut down first",
                                        "synchronize() named ops before hvd.shutdown().")
            held.launch = None
        self.held.clear()
        self.inflight.clear()


def ops_of(ps: ProcessSet) -> NamedOps:
    """The named ops of ``ps`` on this rank."""
    return ps.part(NamedOps)


class Held(Handle):
    """The handle of a named op that has not started yet; it starts by name (see module doc)."""

    __slots__ = ("name", "launch", "process_set", "inner", "error")

    def __init__(self, name: str, launch, process_set: ProcessSet, what: str):
        super().__init__(what=what)
        self.name, self.launch, self.process_set = name, launch, process_set
        self.inner: Handle | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        try:
            self.inner = self.launch()
        except RingtrainError as e:  # raised on every rank alike (checked); reported at wait()
            self.error = e
        self.launch = None

    @property
    def started(self) -> bool:
        return self.inner is not None or self.error is not None

    def poll(self) -> bool:
        if self.error is not None:
            return True
        return self.inner is not None and self.inner.poll()

    is_completed = poll

    def wait(self):
        if not self.started:
            wait_for(self)
        if self.error is not None:
            raise self.error
        return self.inner.wait()

    def __repr__(self) -> str:
        state = "held" if not self.started else ("failed" if self.error else "started")
        return f"<Handle {self.what} {state}>"


def submit(process_set: ProcessSet, name: str | None, launch, *, check: bool, what: str) -> Handle:
    """Start ``launch()`` now, or hold it to be paired by ``name`` (named, checked, several ranks)."""
    ops = ops_of(process_set)
    if name is not None:
        previous = ops.inflight.get(name)
        if previous is not None and not _done(previous):
            raise DuplicateName(
                f"{what} was called with name {name!r} while an op of that name is still in flight on this rank",
                "give concurrent ops distinct names, or synchronize() the first one before reusing its name.",
            )
    if name is not None and len(ops.inflight) >= ops.inflight_sweep:
        _sweep(ops)
    if name is not None and check and process_set.size() > 1 and process_set.included():
        held = Held(name, launch, process_set, what)
        ops.held[name] = held
        ops.inflight[name] = held
        return held
    handle = launch()
    if name is not None:
        ops.inflight[name] = handle
    return handle


def _done(handle: Handle) -> bool:
    try:
        return handle.poll()
    except RingtrainError:  # it failed: it is no longer in flight (its wait() reports the failure)
        return True


def _sweep(ops: NamedOps) -> None:
    """Forget names whose ops are done (scripts often name ops per step: ``f"loss.{step}"``)."""
    for name in [name for name, handle in ops.inflight.items() if _done(handle)]:
        del ops.inflight[name]
    ops.inflight_sweep = max(256, 2 * len(ops.inflight))


# --- the rounds -------------------------------------------------------------------------
def exchange(ps: ProcessSet, call: Call) -> tuple[list[Row], bool]:
    """One check round: every member's descriptor, then held ops started where possible.

    Returns the rows and whether held ops were started in this round.
    """
    describe_held(ps, call)
    rows = checks.exchange(ps, call)
    return rows, settle(ps, rows)


def describe_held(ps: ProcessSet, call: Call) -> None:
    """Put how many named ops this rank holds, and their names' digest, into ``call``."""
    ops = ops_of(ps)
    if not ops.settling and ops.held:
        call.held = len(ops.held)
        call.held_digest = hash_text("\n".join(sorted(ops.held)))


def settle(ps: ProcessSet, rows: list[Row]) -> bool:
    """Start the held ops that every active member holds (same decision on every rank)."""
    ops = ops_of(ps)
    if ops.settling:
        return False
    joined = [i for i, row in enumerate(rows) if row.joined]
    active = [i for i in range(len(rows)) if i not in joined]
    if not active or any(not rows[i].ours or rows[i].held <= 0 for i in active):
        return False
    me = ps.rank()
    mine = sorted(ops.held) if me in active else []
    if not joined and len({rows[i].held_digest for i in active}) == 1:
        names = mine
    else:
        lists = _gather_names(ps, mine)
        common = set(lists[active[0]]).intersection(*(lists[i] for i in active[1:]))
        names = sorted(common)
    if not names:
        return False
    ops.settling = True
    try:
        if me in joined:
            _serve_until_settled(ps)
        else:
            for name in names:
                ops.held.pop(name).start()
            if joined:  # tell the joined ranks that serving is over
                checks.exchange(ps, Call(Kind.SETTLED))
    finally:
        ops.settling = False
    return True


def _serve_until_settled(ps: ProcessSet) -> None:
    while True:
        rows = checks.exchange(ps, Call(Kind.JOIN))
        active = [row for row in rows if not row.joined]
        if active and all(row.ours and row.kind == Kind.SETTLED for row in active):
            return
        serve(rows, ps)


PASSIVE = (Kind.WAIT, Kind.BARRIER)


@waits_for_peers(lambda frame: checks.describe(checks._encode(frame.f_locals["call"])))
def wait_rounds(ps: ProcessSet, call: Call, done) -> list[Row]:
    """Check rounds for a call that waits for the others (a barrier, a held op's synchronize).

    Returns the rows of the round where ``done(rows)`` holds. Meanwhile, as in Horovod, this
    rank simply keeps waiting while others run other collectives — they raise (their check
    finds this call instead of theirs) and come back, which brings ranks that fell out of step
    after an error on some ranks only together again. When every rank waits and no held op
    could start, nobody can progress: every rank raises instead of hanging.
    """
    while True:
        rows, started = exchange(ps, call)
        if done(rows):
            return rows
        if started:
            continue
        active = [row for row in rows if not row.joined]
        if any(not row.ours for row in active):
            raise checks.mismatch(ps, rows)
        if all(row.kind in PASSIVE for row in active):
            raise RingtrainError(
                "every rank waits for the others (in barrier() or in synchronize() of a named op that not every "
                f"rank has submitted); held on this rank: {sorted(ops_of(ps).held)}\n" + checks.mismatch(ps, rows).message,
                "submit the same named ops on every rank before synchronizing any of them, and do not synchronize "
                "one across a barrier() that the others are in (Horovod would hang).",
            )


def wait_for(held: Held) -> None:
    """Run check rounds until ``held`` has started."""
    ps = held.process_set
    if held.name not in ops_of(ps).held:
        raise RingtrainError(f"{held.what} {held.name!r} is no longer held (Horovod was shut down)",
                             "synchronize() named ops before hvd.shutdown().")
    wait_rounds(ps, Call(Kind.WAIT, name=held.name), lambda rows: held.started)


def barrier(ps: ProcessSet) -> None:
    """Return once every active member is in this barrier (joined members count as arrived)."""
    def everyone_here(rows) -> bool:
        return all(row.ours and row.kind in (Kind.BARRIER, Kind.JOIN) for row in rows)

    wait_rounds(ps, Call(Kind.BARRIER), everyone_here)


def _gather_names(ps: ProcessSet, names: list[str]) -> list[list[str]]:
    """Every member's list of names (two small all_gathers on the check group)."""
    group = ps.group_for(None)
    payload = "\n".join(names).encode()
    size = torch.tensor([len(payload)], dtype=torch.int64)
    sizes = torch.empty(ps.size(), dtype=torch.int64)
    all_gather_flat(sizes, size, group=group)
    width = max(int(sizes.max()), 1)
    mine = torch.zeros(width, dtype=torch.uint8)
    if payload:
        mine[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    everyone = torch.empty(ps.size() * width, dtype=torch.uint8)
    all_gather_flat(everyone, mine, group=group)
    out = []
    for i, n in enumerate(sizes.tolist()):
        text = everyone[i * width:i * width + n].numpy().tobytes().decode()
        out.append(text.split("\n") if text else [])
    return out
