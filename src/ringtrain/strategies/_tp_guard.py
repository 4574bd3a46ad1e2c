"""The drift guard: parameters tensor parallelism left replicated must stay equal across their TP group.

A parameter the plan does not cut is held whole by every rank of a tensor-parallel group, and nothing in the
engine checks that they agree: a plan that misses a module (a norm left out under sequence parallelism sees only
its rank's slice of the sequence, so its gradient is a partial sum), or a module computed differently on each rank,
lets the copies drift apart silently — measured: 2e-2 after one step, no error, and a sharded checkpoint keeps one
copy. After the first optimizer step each such parameter is checked:

1. an exact fingerprint of its local values (its bits summed as integers, plain and position-weighted: order-free,
   so equal values give equal sums on every rank) — one small all_gather over the TP group for all of them;
2. only where fingerprints differ, the values themselves are gathered and compared: a difference of rounding (a
   nondeterministic GPU kernel computing the same gradient twice, <= 1e-6 of the largest value) passes, anything
   larger raises on every rank of the group, naming the parameter and the fix.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ..errors import RingtrainError
from ..parallel.mesh import TP

CHUNK = 1 << 22  # elements fingerprinted at once: a transient int64 copy of at most 32 MiB
RELATIVE = 1e-6  # a difference up to this share of the largest value is rounding, not drift
SHOWN = 8  # parameters compared value by value (and named) at most


def replicated_on_tp(p: torch.Tensor) -> bool:
    """Is ``p`` whole on every rank of its TP group (a plain tensor, or a DTensor not sharded along ``tp``)?"""
    names = getattr(getattr(p, "device_mesh", None), "mesh_dim_names", None) or ()
    if TP not in names:
        return True
    return p.placements[names.index(TP)].is_replicate()


def local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """Two int64 sums of ``t``'s bits (plain, and weighted by position): equal values, equal sums, in any order."""
    flat = t.detach().contiguous().view(-1)
    kind = torch.int32 if flat.element_size() % 4 == 0 else torch.int16 if flat.element_size() == 2 else torch.uint8
    bits = flat.view(kind)
    total = torch.zeros(2, dtype=torch.int64, device=flat.device)
    for start in range(0, bits.numel(), CHUNK):
        part = bits[start:start + CHUNK].to(torch.int64)
        weights = torch.arange(start, start + part.numel(), device=part.device, dtype=torch.int64) % 65521 + 1
        total += torch.stack([part.sum(), (part * weights).sum()])
    return total


class DriftGuard:
    """Checks one model's TP-replicated parameters once, after the first optimizer step that updates them.

    ``params()``: the model's parameters under the unsplit names (read when the check runs: FSDP replaces them);
    ``group``: this rank's TP group; ``sequence_parallel``: shapes the advice."""

    def __init__(self, params: Callable[[], dict[str, torch.Tensor]], group: Any, sequence_parallel: bool):
        self.params, self.group, self.sequence_parallel = params, group, sequence_parallel
        self.done = False

    def covers(self, optimizer: torch.optim.Optimizer) -> bool:
        mine = {id(p) for p in self.params().values()}
        return any(id(p) in mine for group in optimizer.param_groups for p in group["params"])

    def check(self) -> None:
        """Collective over the TP group (every rank of it steps the same optimizer at the same step)."""
        import torch.distributed as dist

        self.done = True
        named = [(n, p) for n, p in self.params().items() if replicated_on_tp(p)]
        ranks = dist.get_process_group_ranks(self.group)
        if not named or len(ranks) < 2:
            return
        mine = torch.stack([fingerprint(local(p)) for _, p in named])
        everyone = [torch.empty_like(mine) for _ in ranks]
        dist.all_gather(everyone, mine, group=self.group)
        differ = [i for i in range(len(named)) if any(not torch.equal(e[i], everyone[0][i]) for e in everyone)]
        drifted = []
        for i in differ[:SHOWN]:  # the same list on every rank of the group: the same gathers
            name, p = named[i]
            values = local(p).detach()
            copies = [torch.empty_like(values) for _ in ranks]
            dist.all_gather(copies, values.contiguous(), group=self.group)
            scale = max(float(copies[0].abs().max()), 1e-12) if copies[0].numel() else 1.0
            worst = max(float((c.float() - copies[0].float()).abs().max()) if c.numel() else 0.0 for c in copies)
            if worst > RELATIVE * scale:
                drifted.append((name, worst, scale))
        if drifted:
            raise self.error(drifted, len(differ), ranks)

    def error(self, drifted: list[tuple[str, float, float]], differ: int, ranks: list[int]) -> RingtrainError:
        name, worst, scale = drifted[0]
        module = name.rsplit(".", 1)[0] if "." in name else "(the model)"
        others = [n for n, _, _ in drifted[1:]]
        more = f"; {differ - 1} other parameter(s) differ too" + (f" ({', '.join(others)})" if others else "") \
            if differ > 1 else ""
        sp = (" Under sequence parallelism a norm or dropout in the residual stream, and any module between the "
              "blocks, needs SequenceParallel(); a module that holds parameters and sees the sequence slice "
              "computes only a part of their gradient.") if self.sequence_parallel else ""
        return RingtrainError(
            f"after the first optimizer step, the parameter {name!r} differs across its tensor-parallel group "
            f"(global ranks {ranks}): the largest difference is {worst:.3g} (its largest value {scale:.3g}){more}. "
            "The plan leaves it replicated — every rank of the group holds all of it and must compute the same update "
            "— so the ranks computed different gradients for it, and would go on training different copies",
            f"add its module {module!r} to the plan (TP(plan={{...}}): a style that cuts it, or the style its "
            f"neighbours need), or find what is computed differently on each rank before it (random numbers drawn "
            f"outside DTensor, an input that differs per rank).{sp}")


class Guards:
    """The drift guards of a strategy's models, run by its ``step_context`` after an optimizer's first step."""

    def __init__(self) -> None:
        self.guards: list[DriftGuard] = []

    def watch(self, params: Callable[[], dict[str, torch.Tensor]], group: Any, sequence_parallel: bool) -> None:
        self.guards.append(DriftGuard(params, group, sequence_parallel))

    @contextlib.contextmanager
    def after_step(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        yield
        for guard in self.guards:
            if not guard.done and guard.covers(optimizer):
                guard.check()


def named(module: nn.Module) -> Callable[[], dict[str, torch.Tensor]]:
    return lambda: dict(module.named_parameters())
