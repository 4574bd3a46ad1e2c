"""Process sets: a subset of the ranks that runs collectives among itself.

A process set is a ``torch.distributed`` group (``new_group``), plus what Horovod's
``ProcessSet`` answers (``ranks``, ``size()``, ``rank()``, ``included()``,
``process_set_id``). ``GLOBAL`` is every rank of the default group — it needs no
group of its own, and on one process (no group at all) it is rank 0 of 1.

When the default group is NCCL, CPU tensors cannot go through it; each set then
also holds a Gloo twin over the same ranks, and ``group_for(tensor)`` picks the
one that matches the tensor's device (Horovod moves CPU tensors over MPI/Gloo the
same way). Creating groups is collective: every rank of the job must add and
remove the same sets in the same order, as ``torch.distributed.new_group`` requires.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist

from ..errors import RingtrainError


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _world_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class ProcessSet:
    """Ranks that run collectives together. ``ProcessSet(None)`` (``GLOBAL``) is every rank."""

    def __init__(self, ranks: Iterable[int] | None = None):
        self._ranks = None if ranks is None else sorted({int(r) for r in ranks})
        if self._ranks is not None and not self._ranks:
            raise RingtrainError("a process set with no ranks was asked for", "give at least one rank.")
        self.process_set_id: int | None = 0 if ranks is None else None
        self._group = None  # None = the default group
        self._cpu_group = None
        # Gradient buckets travel on groups of their own, so a rank that has joined can keep
        # zero buckets posted there while it waits for check rounds on the main group (join.py).
        self._grad_group = None
        self._grad_cpu_group = None
        self._bound_world = None  # the default group the global set's groups were made for
        # The gradient layout last verified on this set: (layout hash, wire spec) (grad_sync.py).
        self.grad_layout = None
        # Number of metadata checks this rank has run on this set (join uses it), and how the
        # descriptors travel (None: an all_gather, checks.GatherRows; store_check.StoreRows in debug mode).
        self.check_rounds = 0
        self.checker = None
        self.grad_steps = 0  # gradient steps run on this set (join uses it too)
        # What the main thread reports (liveness/activity.py) for whoever bound this set (a ring's strategy,
        # hvd.init()): a timeline recording there hears this set's gradient buckets too.
        self.activity = None
        # State other modules keep per set (named.py's held ops), each owned by its module (``part``).
        self._parts: dict[type, object] = {}

    @property
    def recorder(self):
        """The timeline recording this set's buckets (tracking/timeline.py), or None."""
        return self.activity.recorder if self.activity is not None else None

    # --- Horovod's ProcessSet API ------------------------------------------
    @property
    def ranks(self) -> list[int]:
        return list(range(_world_size())) if self._ranks is None else list(self._ranks)

    def size(self) -> int:
        return _world_size() if self._ranks is None else len(self._ranks)

    def rank(self) -> int:
        """This process's rank within the set, or -1 when it is not a member."""
        me = _world_rank()
        if self._ranks is None:
            return me
        return self._ranks.index(me) if me in self._ranks else -1

    def included(self) -> bool:
        return self.rank() >= 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcessSet) and self.ranks == other.ranks

    def __hash__(self) -> int:
        return hash(tuple(self.ranks))

    def __repr__(self) -> str:
        ranks = "all" if self._ranks is None else self._ranks
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={ranks})"

    # --- machinery -------------------------------------------------------
    @property
    def is_global(self) -> bool:
        return self._ranks is None

    def global_rank(self, set_rank: int) -> int:
        return self.ranks[set_rank]

    def group_for(self, tensor: torch.Tensor | None = None):
        """The engine group for a collective on ``tensor`` (the Gloo twin for CPU tensors under NCCL)."""
        if self._cpu_group is not None and (tensor is None or tensor.device.type == "cpu"):
            return self._cpu_group
        return self._group

    def grad_group_for(self, tensor: torch.Tensor):
        """The engine group for gradient buckets (the Gloo twin of it for CPU tensors under NCCL)."""
        if self._grad_cpu_group is not None and tensor.device.type == "cpu":
            return self._grad_cpu_group
        return self._grad_group

    def part(self, kind: type):
        """This set's ``kind`` object (``kind()`` on first use): state another module keeps per set.

        The module that defines ``kind`` owns what is in it; the set only holds one per set and
        calls its ``clear()`` when the set is removed or reset (``shutdown``), so this module
        imports none of the modules that keep state here (no import circle).
        """
        found = self._parts.get(kind)
        if found is None:
            found = self._parts[kind] = kind()
        return found

    def clear_parts(self) -> None:
        """Tell every module's per-set state that this set is gone (``remove``, ``shutdown``)."""
        for part in self._parts.values():
            part.clear()

    def require_member(self, what: str) -> None:
        if not self.included():
            raise RingtrainError(
                f"{what} on {self!r} was called on rank {_world_rank()}, which is not in that process set",
                "call collectives of a process set only on its member ranks (check ps.included()).",
            )
        if not self.is_global and self._group is None and self.size() > 1 and _world_size() > 1:
            raise RingtrainError(
                f"{what} was called on {self!r}, which was never added",
                "register it first on every rank: hvd.add_process_set(ranks) or hvd.init(process_sets=[...]).",
            )

    def bind(self) -> None:
        """Create the engine groups for this set (collective: every rank of the job calls it)."""
        if _world_size() == 1:
            return
        default_backend = dist.get_backend()
        needs_cpu_twin = default_backend == "nccl"
        if self._ranks is None:
            world = dist.group.WORLD
            if self._bound_world is not world:
                self._cpu_group = dist.new_group(backend="gloo") if needs_cpu_twin else None
                self._grad_group = dist.new_group()
                self._grad_cpu_group = dist.new_group(backend="gloo") if needs_cpu_twin else None
                self._bound_world = world
            return
        bad = [r for r in self._ranks if not 0 <= r < _world_size()]
        if bad:
            raise RingtrainError(
                f"process set ranks {bad} are outside the job's {_world_size()} ranks",
                f"use ranks in [0, {_world_size()}).",
            )
        self._group = dist.new_group(self._ranks)
        self._grad_group = dist.new_group(self._ranks)
        if needs_cpu_twin:
            self._cpu_group = dist.new_group(self._ranks, backend="gloo")
            self._grad_cpu_group = dist.new_group(self._ranks, backend="gloo")

    def unbind(self) -> None:
        for group in (self._group, self._cpu_group, self._grad_group, self._grad_cpu_group):
            if group is not None and self.included() and dist.is_initialized():
                dist.destroy_process_group(group)
        self._group = self._cpu_group = self._grad_group = self._grad_cpu_group = None
        self.grad_layout = None


GLOBAL = ProcessSet(None)


class ProcessSetTable:
    """The registered sets and their ids (Horovod: the global set is 0, others count up)."""

    def __init__(self) -> None:
        self._sets: dict[int, ProcessSet] = {0: GLOBAL}
        self._next_id = 1

    def add(self, ranks_or_set) -> ProcessSet:
        ps = ranks_or_set if isinstance(ranks_or_set, ProcessSet) else ProcessSet(ranks_or_set)
        if ps.is_global:
            return GLOBAL
        for existing in self._sets.values():
            if existing is not GLOBAL and existing.ranks == ps.ranks:
                raise RingtrainError(
                    f"a process set with ranks {ps.ranks} is already registered ({existing!r})",
                    "reuse that process set object, or remove it first.",
                )
        ps.bind()
        ps.process_set_id = self._next_id
        self._next_id += 1
        self._sets[ps.process_set_id] = ps
        return ps

    def remove(self, ps: ProcessSet) -> bool:
        if ps is GLOBAL or ps.is_global:
            raise RingtrainError("the global process set cannot be removed", "remove only sets you added.")
        found = self._sets.pop(ps.process_set_id, None) if ps.process_set_id is not None else None
        if found is None:
            return False
        found.unbind()
        found.process_set_id = None
        found.clear_parts()
        return True

    def reset(self) -> None:
        for ps in list(self._sets.values()):
            if ps is not GLOBAL:
                ps._group = ps._cpu_group = ps._grad_group = ps._grad_cpu_group = None
                ps.process_set_id = None
            ps.grad_layout = None
        GLOBAL.check_rounds = GLOBAL.grad_steps = 0  # its Gloo twin stays with the default group it was made for
        for ps in self._sets.values():  # GLOBAL included
            ps.clear_parts()
        self._sets = {0: GLOBAL}
        self._next_id = 1

    def get(self, process_set_id: int) -> ProcessSet:
        return self._sets[process_set_id]

    def __iter__(self):
        return iter(self._sets.values())
