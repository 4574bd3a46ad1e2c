"""A model built on the meta device, made real where a rank keeps it, and nowhere whole.

    with torch.device("meta"):
        model = GPT(config)                     # shapes only: no memory, no initialisation
    model, optimizer = ring.setup(model, optimizer)

The strategy first decides what this rank keeps — FSDP shards the meta model and allocates
only this rank's shards, a pipeline only its stage, DDP the whole model — and allocates it
(``module.to_empty``). ``materialize`` then initialises what was allocated: module by module,
each module's own tensors are made whole on the CPU for a moment, its ``reset_parameters()``
runs on them, and the part this rank keeps is copied out (a DTensor's shard, or all of it);
tensors no rank here keeps (another stage's) are initialised and dropped, so the random
stream advances exactly as when the model is built whole. At most one module's tensors are
whole at any time.

**Same seed, same model, at any world size.** Every rank initialises from the same random
state (rank 0's, sent to all) on the CPU's generator, in the same order, so the weights do not
depend on the number of ranks, the strategy or the device. They equal a model built normally
(on the CPU, from the same random state) when the modules' own initialisation matches their
construction: modules are visited children first, then the parent (the order constructors run
in: ``nn.MultiheadAttention`` builds its ``out_proj`` before its own ``_reset_parameters``),
and each module's ``reset_parameters`` initialises its own tensors. A module with tensors of
its own and no ``reset_parameters`` cannot be initialised from the meta device and is named.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
from torch import nn

from ..checkpoint.state import global_shape, is_sharded
from ..errors import RingtrainError


def on_meta(module: nn.Module) -> bool:
    """Was ``module`` built on the meta device: every tensor shapes without storage? (A model only partly
    on meta — ``rt.split`` onto a meta stand-in device — is not.)"""
    tensors = [*module.parameters(), *module.buffers()]
    return bool(tensors) and all(t.is_meta for t in tensors)


def _own(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]


def _reset_of(module: nn.Module) -> Callable[[], Any] | None:
    reset = getattr(module, "reset_parameters", None)
    if reset is None and isinstance(module, nn.MultiheadAttention):
        reset = module._reset_parameters  # torch's own name for this class's initialisation
    return reset if callable(reset) else None


def _children_first(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    for name, child in module.named_children():
        yield from _children_first(child, f"{prefix}{name}.")
    yield prefix.rstrip("."), module


def check(root: nn.Module) -> None:
    """Refuse, before anything is allocated, a meta model that ``materialize`` cannot initialise."""
    missing = [f"{name or '(the model)'} ({type(m).__name__}: {', '.join(n for n, _ in _own(m))})"
               for name, m in _children_first(root) if _own(m) and _reset_of(m) is None]
    if missing:
        raise RingtrainError(
            "the model was built on the meta device, but these modules hold tensors of their own and no "
            f"reset_parameters() to initialise them: {'; '.join(missing[:8])}" + (" ..." if len(missing) > 8 else ""),
            "give each such module a reset_parameters() that fills its own parameters and buffers (what nn.Linear "
            "and nn.BatchNorm2d have), or build the model on the CPU instead of under torch.device('meta').",
        )
    owners: dict[int, list[str]] = {}
    for name, m in root.named_modules(remove_duplicate=False):
        for attr, p in m.named_parameters(recurse=False):
            owners.setdefault(id(p), []).append(f"{name}.{attr}" if name else attr)
    tied = [names for names in owners.values() if len(set(names)) > 1]
    if tied:
        raise RingtrainError(
            f"the model was built on the meta device with tied (shared) parameters: {', '.join(tied[0])}; allocating "
            "it would untie them",
            "build this model on the CPU (not under torch.device('meta')), or tie the weights in a module's "
            "reset_parameters().",
        )


def rank0_rng_state(broadcast_object: Callable[[Any], Any]) -> torch.Tensor:
    """The CPU random state every rank initialises from: rank 0's."""
    return broadcast_object(torch.get_rng_state())


@torch.no_grad()
def materialize(root: nn.Module, rng_state: torch.Tensor) -> None:
    """Initialise every allocated tensor of ``root`` (see the module docstring); meta ones are skipped."""
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(rng_state)
        for name, module in _children_first(root):
            own = _own(module)
            if not own:
                continue
            reset = _reset_of(module)
            if reset is None:
                raise RingtrainError(f"{name or 'the model'} ({type(module).__name__}) has no reset_parameters()",
                                     "give it one, or build the model on the CPU.")
            kept = dict(own)
            for attr, t in own:  # whole, plain, on the CPU, for reset_parameters to fill
                whole = torch.empty(global_shape(t), dtype=t.dtype)
                setattr(module, attr, nn.Parameter(whole, requires_grad=t.requires_grad)
                        if isinstance(t, nn.Parameter) else whole)
            try:
                reset()
                made = {attr: getattr(module, attr) for attr, _ in own}
            finally:
                for attr, t in own:
                    setattr(module, attr, t)
            for attr, t in kept.items():
                if t.is_meta:
                    continue  # not this rank's: initialised only to keep the random stream in step
                _copy_into(t, made[attr].detach())


def _copy_into(target: torch.Tensor, whole: torch.Tensor) -> None:
    if is_sharded(target):
        from torch.distributed.tensor import distribute_tensor

        local = target.to_local()
        if local.is_meta:
            return
        shard = distribute_tensor(whole, target.device_mesh, target.placements, src_data_rank=None).to_local()
        local.copy_(shard)
    else:
        target.copy_(whole)
