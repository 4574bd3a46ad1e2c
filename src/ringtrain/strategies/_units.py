"""Which submodules FSDP shards as units of their own (``FSDP(wrap=...)``).

A unit's parameters are all-gathered together before its forward and freed after it, so the
units decide the peak memory (the largest unit, whole, beside everyone's shards) and how much
communication overlaps with computation. torch's FSDP2 leaves the choice to the caller
(``fully_shard`` per block, then the root); this module makes it:

* ``"auto"`` (default): the *repeated blocks* — modules of one class (containers: of one
  structure) that appear two or more times in an ``nn.Sequential``, ``nn.ModuleList`` or
  ``nn.ModuleDict`` (transformer layers, ResNet blocks, an MLP's Linears, Sequential blocks) —
  outermost first, then any remaining direct child of the model holding at least ``1/8`` of its
  parameters (an embedding, a large head);
* a list of classes: every outermost module of those classes (Fabric/Accelerate's
  ``transformer_layer_cls``);
* a callable ``wrap(name, module) -> bool``: the modules it accepts (outermost and nested);
* ``None``: the model is one unit.

The model itself is always the last unit (it takes the parameters no unit took). A module
whose parameters are shared with modules outside it (tied embeddings) is never a unit of its
own: its parameters stay with the model's unit, where both users can reach them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from torch import nn

from ..errors import RingtrainError

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
LARGE_SHARE = 1 / 8


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _shares_parameters(root: nn.Module) -> Callable[[str], bool]:
    """Does the subtree at ``name`` hold a parameter that is also registered outside it?"""
    owners: dict[int, set[str]] = {}
    for name, module in root.named_modules(remove_duplicate=False):
        for _, p in module.named_parameters(recurse=False):
            owners.setdefault(id(p), set()).add(name)

    def inside(owner: str, prefix: str) -> bool:
        return prefix == "" or owner == prefix or owner.startswith(prefix + ".")

    def shares(prefix: str) -> bool:
        return any(any(inside(o, prefix) for o in names) and not all(inside(o, prefix) for o in names)
                   for names in owners.values())

    return shares


def _kind(module: nn.Module) -> Any:
    """What makes two modules "the same block": their class; for a container (an nn.Sequential block),
    its whole structure — classes and parameter shapes — since every container has the same class."""
    if not isinstance(module, _CONTAINERS):
        return type(module)
    return (type(module), tuple((type(m), tuple(tuple(p.shape) for p in m.parameters(recurse=False)))
                                for m in module.modules()))


def _outermost(names: list[str]) -> list[str]:
    chosen: list[str] = []
    for name in sorted(names, key=lambda n: n.count(".")):
        if not any(name.startswith(c + ".") for c in chosen):
            chosen.append(name)
    return chosen


def repeated(root: nn.Module, keep: Callable[[str], bool] = lambda name: True) -> list[str]:
    """The repeated blocks: children (with parameters) of an nn.Sequential / nn.ModuleList / nn.ModuleDict whose kind
    appears two or more times, outermost among those ``keep`` accepts (activation checkpointing and compile take
    them as blocks, too)."""
    in_containers = [(f"{n}.{c}" if n else c, child) for n, m in root.named_modules() if isinstance(m, _CONTAINERS)
                     for c, child in m.named_children() if _count(child)]
    kinds = Counter(_kind(child) for _, child in in_containers)
    return _outermost([n for n, child in in_containers if kinds[_kind(child)] >= 2 and keep(n)])


def choose(root: nn.Module, wrap: Any) -> list[str]:
    """The names of the submodules to shard as units, children before their parents (fully_shard's order)."""
    modules = dict(root.named_modules())
    shares = _shares_parameters(root)
    if wrap is None:
        return []
    if wrap == "auto":
        picked = repeated(root, keep=lambda name: not shares(name))
        total = _count(root)
        for name, child in root.named_children():
            large = total and _count(child) >= total * LARGE_SHARE
            if large and not any(p == name or p.startswith(name + ".") for p in picked) and not shares(name):
                picked.append(name)
        names = picked
    elif callable(wrap) and not isinstance(wrap, type):
        names = [n for n, m in modules.items() if n and wrap(n, m)]
    elif isinstance(wrap, (list, tuple, set)) and all(isinstance(c, type) and issubclass(c, nn.Module) for c in wrap):
        names = _outermost([n for n, m in modules.items() if n and isinstance(m, tuple(wrap))])
    else:
        raise RingtrainError(
            f"FSDP got wrap={wrap!r}",
            "use wrap='auto' (repeated blocks and large children), a list of module classes (e.g. [Block]), a "
            "function wrap(name, module) -> bool, or None (the whole model as one unit).",
        )
    tied = [n for n in names if shares(n)]
    if tied:
        raise RingtrainError(
            f"FSDP(wrap=...) chose {tied[0]!r} as a unit, but it shares parameters with modules outside it (tied weights)",
            "leave that module out of wrap=: tied parameters must be in one unit (the model's).",
        )
    names = [n for n in names if _count(modules[n])]  # a unit without parameters has nothing to shard
    return sorted(set(names), key=lambda n: (-n.count("."), list(modules).index(n)))
