"""Which submodules are a model's blocks, for activation checkpointing and per-block compile.

"auto": the repeated blocks FSDP's ``wrap="auto"`` takes as units too (_units.repeated: children of an
``nn.ModuleList`` / ``nn.Sequential`` / ``nn.ModuleDict`` of one kind that appear two or more times — transformer
layers, ResNet stages' blocks), outermost first; or the modules of a list of classes (outermost); or those a function
``f(name, module) -> bool`` accepts. A model with no block is refused, saying how to name them: checkpointing or
compiling the whole model as one piece saves nothing (its inputs are the batch) or hides FSDP's hooks from the
compiler.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import RingtrainError
from . import _units


def check(blocks: Any, what: str) -> Any:
    """``blocks=`` as given, or the error saying what it may be."""
    if blocks == "auto" or (callable(blocks) and not isinstance(blocks, type)):
        return blocks
    if isinstance(blocks, (list, tuple, set)) and blocks and all(
            isinstance(c, type) and issubclass(c, nn.Module) for c in blocks):
        return list(blocks)
    raise RingtrainError(f"{what} got blocks={blocks!r}",
                         "use blocks='auto' (the repeated blocks), a list of module classes (e.g. [Block]) or a "
                         "function f(name, module) -> bool.")


def find(model: nn.Module, blocks: Any, what: str) -> list[str]:
    """The names of ``model``'s blocks (outermost, in the model's order)."""
    blocks = check(blocks, what)
    modules = dict(model.named_modules())
    if blocks == "auto":
        names = _units.repeated(model)
    elif isinstance(blocks, list):
        names = _units._outermost([n for n, m in modules.items() if n and isinstance(m, tuple(blocks))])
    else:
        names = _units._outermost([n for n, m in modules.items() if n and blocks(n, m)])
    if not names:
        found = "no repeated block (children of one class in an nn.ModuleList or nn.Sequential)" if blocks == "auto" \
            else "no module that blocks= names"
        raise RingtrainError(
            f"{what}: {type(model).__name__} has {found}",
            "name the blocks: activation_checkpointing=rt.strategies.Checkpointing('full', blocks=[YourBlock]) "
            "(or compile=rt.strategies.Compile(blocks=[YourBlock])); blocks= also takes f(name, module) -> bool.")
    order = list(modules)
    return sorted(names, key=order.index)
