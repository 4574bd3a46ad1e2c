"""Activation checkpointing per block: ``Ring(activation_checkpointing="full" | "selective")``.

A checkpointed block keeps only its inputs from the forward and runs its forward again in the backward to get the
activations back (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"): "full" recomputes everything
inside the block, "selective" saves the outputs of the expensive ops (matmuls, attention, reduce-scatters; every
second matmul recomputed) and recomputes the cheap ones — torchtitan's op-level policy, on torch's
``create_selective_checkpoint_contexts``. The engine is ``torch.utils.checkpoint.checkpoint`` (non-reentrant), the
one torch's ``checkpoint_wrapper`` calls.

Why not ``checkpoint_wrapper`` itself: it puts each block inside a new module, so every name under it gains
``_checkpoint_wrapped_module.`` — in ``named_parameters``, in a TP plan's patterns, in FSDP's units, in the names a
sharded checkpoint is written under (the trap torch's users report: a checkpoint saved with AC does not load
without it). Here the block's class is swapped for a subclass whose ``forward`` runs the original under
``checkpoint`` (what FSDP2's ``fully_shard`` does to add its own behaviour): the module tree, its names and its
``state_dict`` stay the user's, and FSDP2, tensor parallelism and ``nn.Module.compile`` see an ordinary module.

Which modules are blocks (_blocks.py): the repeated children of an ``nn.ModuleList`` / ``nn.Sequential`` (the
transformer layers), or those named by ``rt.strategies.Checkpointing(mode, blocks=...)``.
``apply_activation_checkpointing(model, mode)`` is a plain function: it needs no process group and works on a model
on the meta device (a planner lays out "AC off / full / selective" with it).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
from torch import nn

from ..errors import RingtrainError
from . import _blocks

MODES = ("full", "selective")
_CLASSES: dict[tuple[type, str], type] = {}  # (the block's class, mode) -> its checkpointed subclass, made once


def _save_list() -> set[Any]:
    """The ops whose outputs selective AC saves (torchtitan's list, with the CPU's attention kernel and the matmuls
    a Linear with bias becomes)."""
    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention", "max")
    ops = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    if hasattr(torch.ops, "_c10d_functional") and hasattr(torch.ops._c10d_functional, "reduce_scatter_tensor"):
        ops.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
    return ops


@functools.lru_cache(maxsize=1)
def _saved_ops() -> tuple[frozenset[Any], frozenset[Any]]:
    aten = torch.ops.aten
    matmuls = frozenset(op for op in (aten.mm.default, aten.addmm.default, aten.bmm.default))
    return frozenset(_save_list()), matmuls


def selective_contexts() -> tuple[Any, Any]:
    """A fresh pair of contexts for one checkpointed call (torch's ``context_fn``): save what ``_save_list`` names,
    except every second matmul (counted separately in the forward and in its recomputation, so both agree)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    saved, matmuls = _saved_ops()
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        if op in matmuls:
            which = "recompute" if ctx.is_recompute else "forward"
            counts[which] += 1
            if counts[which] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class _StatsFrozen:
    """The recomputation's context: the block's BatchNorm layers run as in the forward (the same kernel, the same
    saved tensors) with momentum 0, so the batch is not added to their running statistics a second time, and their
    ``num_batches_tracked`` put back. torch's checkpoint reruns the block's forward in the backward, BatchNorm's side
    effects included: each running mean and variance took every batch twice and ``num_batches_tracked`` counted 2 per
    step (a ResNet's evaluation drifted; fairscale's ``patch_batchnorm`` fixes the same for the reentrant one)."""

    def __init__(self, norms: list[nn.Module], inside: Any = None):
        self.norms, self.inside, self.saved = norms, inside, []  # inside: entered after, so its ops do not see ours

    def __enter__(self) -> None:
        self.saved = [(norm.momentum, norm.num_batches_tracked.clone()) for norm in self.norms]
        for norm in self.norms:
            norm.momentum = 0.0  # running = 1 * running + 0 * batch: unchanged
        if self.inside is not None:
            self.inside.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.inside is not None:
            self.inside.__exit__(*exc)
        for norm, (momentum, tracked) in zip(self.norms, self.saved):
            norm.momentum = momentum
            norm.num_batches_tracked.copy_(tracked)


def _tracking_norms(block: nn.Module) -> list[nn.Module]:
    return [m for m in block.modules() if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats
            and m.num_batches_tracked is not None]


def _norms_once(norms: list[nn.Module], selective: bool) -> tuple[Any, Any]:
    """torch's ``context_fn`` for a block with BatchNorm: its recomputation under ``_StatsFrozen`` (and, for
    "selective", inside the selective policy's own contexts)."""
    if not selective:
        return contextlib.nullcontext(), _StatsFrozen(norms)
    forward, recompute = selective_contexts()
    return forward, _StatsFrozen(norms, inside=recompute)  # the policy's dispatch mode inside: ours outside it


def _checkpoint(checkpoint: Any, block: nn.Module, forward: Any, selective: bool, *args: Any, **kwargs: Any) -> Any:
    """torch's ``checkpoint`` of ``block``'s own ``forward``, with its BatchNorm layers counting each batch once."""
    norms = [] if torch.compiler.is_compiling() else _tracking_norms(block)
    if norms:  # eager only: a compiled region's recomputation is the compiler's, its buffers' updates applied once
        kwargs["context_fn"] = functools.partial(_norms_once, norms, selective)
    elif selective:  # a function the compiler can see (see checkpointed_class)
        kwargs["context_fn"] = selective_contexts
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def checkpointed_class(cls: type, mode: str) -> type:
    """``cls`` with its forward run under torch's non-reentrant checkpoint (``mode``: "full" or "selective")."""
    if getattr(cls, "_ringtrain_checkpointing", None) is not None:
        return cls
    key = (cls, mode)
    if key not in _CLASSES:
        # Two functions, not one with the mode in a variable, and no closure as context_fn where the block is
        # compiled: the compiler traces the checkpoint as one region only where context_fn is a function it can see
        # (a closure's cell is refused: "checkpoint not implemented for LazyVariableTracker context_fn").
        from torch.utils.checkpoint import checkpoint

        def full(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            return _checkpoint(checkpoint, self, super(made, self).forward, False, *args, **kwargs)

        def selective(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            return _checkpoint(checkpoint, self, super(made, self).forward, True, *args, **kwargs)

        forward = selective if mode == "selective" else full
        made = type(cls.__name__, (cls,), {"forward": forward, "_ringtrain_checkpointing": mode,
                                            "__module__": cls.__module__, "__qualname__": cls.__qualname__})
        _CLASSES[key] = made
    return _CLASSES[key]


def mode_of(module: nn.Module) -> str | None:
    """The activation checkpointing ``module`` runs under ("full", "selective"), or None."""
    return getattr(type(module), "_ringtrain_checkpointing", None)


def apply_activation_checkpointing(model: nn.Module, mode: str | None, blocks: Any = "auto") -> list[str]:
    """Checkpoint each block of ``model`` in place (``mode``: "full", "selective", or None for nothing); returns the
    blocks' names. ``blocks``: "auto" (the repeated blocks), a list of module classes, or ``f(name, module) -> bool``.
    Names and ``state_dict`` keys are unchanged; a block already checkpointed is left as it is."""
    mode = check_mode(mode)
    if mode is None:
        return []
    names = _blocks.find(model, blocks, f"activation_checkpointing={mode!r}")
    for name in names:
        block = model.get_submodule(name)
        if mode_of(block) is None:
            block.__class__ = checkpointed_class(type(block), mode)
    return names


def check_mode(mode: Any) -> str | None:
    if mode is None or mode in MODES:
        return mode
    raise RingtrainError(f"activation_checkpointing={mode!r}",
                         "use None (off), 'full' (recompute each block in the backward) or 'selective' (keep the "
                         "matmuls' and attention's outputs, recompute the rest).")


class Checkpointing:
    """``rt.strategies.Checkpointing(mode="full", blocks="auto")``: activation checkpointing of ``blocks`` ("auto":
    the repeated blocks; a list of module classes, e.g. ``[Block]``; or ``f(name, module) -> bool``), for
    ``Ring(activation_checkpointing=...)`` where the blocks must be named. ``"full"`` is ``Checkpointing("full")``."""

    def __init__(self, mode: str = "full", blocks: Any = "auto"):
        self.mode = check_mode(mode)
        if self.mode is None:
            raise RingtrainError("Checkpointing(mode=None)", "leave activation_checkpointing=None for no checkpointing.")
        self.blocks = _blocks.check(blocks, "Checkpointing")

    def apply(self, module: nn.Module) -> list[str]:
        return apply_activation_checkpointing(module, self.mode, self.blocks)

    def __repr__(self) -> str:
        return f"Checkpointing({self.mode!r}{'' if self.blocks == 'auto' else ', blocks=...'})"

    @classmethod
    def of(cls, value: Any) -> "Checkpointing | None":
        """``Ring(activation_checkpointing=)``: None, a mode, or a Checkpointing."""
        if value is None or isinstance(value, Checkpointing):
            return value
        if isinstance(value, str):
            return cls(check_mode(value) or "full")
        check_mode(value)  # raises
        return None

