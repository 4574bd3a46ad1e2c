"""``Ring(compile=True)``: torch.compile per block, and the order of what is applied to the blocks.

torchtitan's order, which every strategy here follows: tensor parallelism first (the blocks' weights are DTensors
before anything traces them), then activation checkpointing (checkpointing.py: the compiler sees the checkpointed
forward and traces the checkpoint as one region), then compile, then FSDP (``fully_shard`` last: its all-gathers
and reduce-scatters stay outside the compiled graphs, in its hooks). Each block is compiled in place with
``nn.Module.compile`` — the module keeps its names (``torch.compile(block)`` would wrap it in an ``OptimizedModule``
and prefix every name with ``_orig_mod.``) — and lazily: the first forward compiles it. The blocks are one class,
so after the first one the others reuse its graph (a recompile only where a shape or a guard changes).

``BlockTransforms`` is what the Ring hands a strategy (``Strategy.transform_blocks``); the strategy applies it at
the point of its ``wrap_module`` where the order wants it: after its tensor-parallel cut, before its wrapper or
shards. Without AC and compile it does nothing.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import RingtrainError
from . import _blocks
from .checkpointing import Checkpointing


def apply_compile(model: nn.Module, blocks: Any = "auto", **options: Any) -> list[str]:
    """Compile each block of ``model`` in place (``nn.Module.compile(**options)``: torch.compile's keywords); returns
    the blocks' names."""
    names = _blocks.find(model, blocks, "compile=True")
    for name in names:
        model.get_submodule(name).compile(**options)
    return names


def is_compiled(module: nn.Module) -> bool:
    """Was ``nn.Module.compile`` called on ``module``?"""
    return getattr(module, "_compiled_call_impl", None) is not None


class Compile:
    """``rt.strategies.Compile(blocks="auto", **options)``: per-block ``torch.compile`` (``options``: its keywords —
    ``mode``, ``fullgraph``, ``dynamic``, ``backend``...), for ``Ring(compile=...)`` where the blocks must be named
    or options given. ``compile=True`` is ``Compile()``."""

    def __init__(self, blocks: Any = "auto", **options: Any):
        self.blocks = _blocks.check(blocks, "Compile")
        self.options = options

    def apply(self, module: nn.Module) -> list[str]:
        return apply_compile(module, self.blocks, **self.options)

    def __repr__(self) -> str:
        shown = ([] if self.blocks == "auto" else ["blocks=..."]) + [f"{k}={v!r}" for k, v in self.options.items()]
        return f"Compile({', '.join(shown)})"

    @classmethod
    def of(cls, value: Any) -> "Compile | None":
        """``Ring(compile=)``: False, True, or a Compile."""
        if value is False or value is None:
            return None
        if value is True:
            return cls()
        if isinstance(value, Compile):
            return value
        raise RingtrainError(f"Ring got compile={value!r}",
                             "use compile=True (torch.compile per block), False, or "
                             "rt.strategies.Compile(blocks=[Block], mode=...).")


class BlockTransforms:
    """Activation checkpointing, then compile, on a model's blocks (either may be None: then it is not applied)."""

    def __init__(self, checkpointing: Checkpointing | None = None, compile: Compile | None = None):
        self.checkpointing, self.compile = checkpointing, compile
        self.applied: list[tuple[str, list[str]]] = []  # ("checkpointing" | "compile", the blocks), in order

    @classmethod
    def of(cls, activation_checkpointing: Any = None, compile: Any = False) -> "BlockTransforms":
        """From ``Ring(activation_checkpointing=, compile=)``, checked."""
        return cls(Checkpointing.of(activation_checkpointing), Compile.of(compile))

    def __bool__(self) -> bool:
        return self.checkpointing is not None or self.compile is not None

    def apply(self, module: nn.Module) -> nn.Module:
        """``module``'s blocks checkpointed, then compiled, in place; returns ``module``."""
        if self.compile is not None and any(type(p).__name__ == "DTensor" for p in module.parameters()):
            # Measured with torch 2.13 on CPU/Gloo (FSDP(tp=2), the tests' tiny transformer, SGD): compiled blocks over
            # DTensors trained 7.6e-3 away from eager in 4 steps, and with activation checkpointing the backward
            # failed ("expected all tensors_saved_with_vc_check to be Tensors": a DeviceMesh among the saved values).
            raise RingtrainError("compile=True under tensor parallelism is not supported yet: torch's compiled "
                                 "blocks over DTensors did not train as eager does (7.6e-3 apart after 4 steps)",
                                 "drop compile=True with tp= (activation_checkpointing= works under tensor "
                                 "parallelism), or compile without tp=.")
        if self.checkpointing is not None:
            self.applied.append(("checkpointing", self.checkpointing.apply(module)))
        if self.compile is not None:
            self.applied.append(("compile", self.compile.apply(module)))
        return module

    def refuse_compile(self, where: str, hint: str) -> None:
        """A strategy that cannot run compiled blocks says so, before anything is applied."""
        if self.compile is not None:
            raise RingtrainError(f"compile=True with {where} is not supported yet", hint)

    def __repr__(self) -> str:
        return f"BlockTransforms({self.checkpointing!r}, {self.compile!r})"
