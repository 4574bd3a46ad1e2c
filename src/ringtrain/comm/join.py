"""``barrier`` and ``join``: synchronisation points, and finishing with uneven data.

``join()`` (Horovod 0.17+): a rank that has run out of data calls it and then
takes part, with zeros, in every allreduce the other ranks still run — their
gradient averages keep flowing — until every rank has joined; it returns the rank
that joined last. Joined ranks learn what the others run from the metadata check's
descriptors, so ``join`` needs checks on (the default) — except gradient steps of an
already verified layout, which send no check (grad_sync.py): for those a joined rank
keeps zero buckets posted on the set's gradient group. As in Horovod, only
allreduce (including the DistributedOptimizer's gradient buckets) and barrier may
run while some ranks have joined; anything else raises on the ranks that called it,
while the joined ranks keep waiting in ``join()`` (so the others can still join). Averages
keep dividing by the full set size, like DDP's join (``divide_by_initial_world_size``).
"""

from __future__ import annotations

import time

import torch.distributed as dist

from ..errors import RingtrainError
from ..liveness.activity import waits_for_peers
from . import checks, grad_sync, named, validate
from .checks import Call, Kind, Row
from .groups import ProcessSet
from .joined import serve


def barrier(*, process_set: ProcessSet, check: bool = True, strict: bool = False) -> None:
    """Return once every member is here. Checked, a rank in a barrier keeps waiting while others run
    other collectives (Horovod's semantics: they raise); ``strict``: a rank that calls something else
    makes every rank raise, this one included (ring.barrier under debug_collectives)."""
    process_set.require_member("barrier")
    if process_set.size() == 1:
        return
    if check and strict:
        validate.run(process_set, Call(Kind.BARRIER), True, allow_joined=True)  # the check is itself a barrier
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
    # When this rank joined, counted in what every member takes part in: check rounds and gradient
    # steps (joined ranks count the steps they serve). The highest count joined last (ties: highest rank).
    joined_at = process_set.check_rounds + process_set.grad_steps
    mirror = _Mirror(process_set)
    while True:
        rows = _round(process_set, Call(Kind.JOIN, aux=joined_at), mirror)
        if all(row.joined for row in rows):
            mirror.drain()
            last = max(range(len(rows)), key=lambda i: (rows[i].aux, i))  # aux: when each joined
            return process_set.global_rank(last)
        serve(rows, process_set, device, mirror)


@waits_for_peers(lambda frame: "join()")
def _round(ps: ProcessSet, call: Call, mirror: "_Mirror") -> list[Row]:
    """One check round, while serving the gradient steps the others run meanwhile (they send no check)."""
    named.describe_held(ps, call)
    pending = checks.exchange_async(ps, call)
    pause = 0.0002
    while not pending.poll():
        if mirror.serve_completed():
            pause = 0.0002
        else:
            time.sleep(pause)
            pause = min(pause * 2, 0.005)  # joined ranks are idle: do not take CPU from the others
    rows = pending.wait()
    named.settle(ps, rows)
    return rows


class _Mirror:
    """Zero gradient buckets of the set's verified layout, kept posted on its gradient group.

    The others verify a layout once and then step without a check round (grad_sync.py), so
    this rank cannot learn of each step; its posted zeros take part in whatever step comes.
    A step's bucket says whether some rank really stepped (then post again) or only joined
    ranks' zeros or a flush completed it (the layout changed, or everyone has joined).
    """

    def __init__(self, ps: ProcessSet):
        self.ps = ps
        self.posted = grad_sync.post_zeros(ps.grad_layout[1], ps) if ps.grad_layout is not None else None

    def _real_step(self) -> bool:
        buffers, works = self.posted
        for work in works:
            work.wait()
        real = bool(buffers[0][-1].item() > 0)
        self.ps.grad_steps += real
        return real

    def serve_completed(self) -> bool:
        """If a step completed the posted zeros, post the next; True when one did."""
        if self.posted is None or not all(w.is_completed() for w in self.posted[1]):
            return False
        if self._real_step():
            self.posted = grad_sync.post_zeros(self.ps.grad_layout[1], self.ps)
            return True
        self.posted = None  # a flush or the final drain: the check round that caused it is on its way
        return False

    def switch(self, layout_hash: int) -> None:
        """The others verified another layout (after completing our posted zeros with a flush)."""
        while self.posted is not None and self._real_step():
            self.posted = grad_sync.post_zeros(self.ps.grad_layout[1], self.ps)
        spec = grad_sync.spec_of(self.ps, layout_hash)
        self.ps.grad_layout = (layout_hash, spec)
        self.posted = grad_sync.post_zeros(spec, self.ps)

    def drain(self) -> None:
        """Everyone has joined; every rank's posted zeros complete each other's."""
        while self.posted is not None and self._real_step():  # a last step not yet seen
            self.posted = grad_sync.post_zeros(self.ps.grad_layout[1], self.ps)
        self.posted = None
