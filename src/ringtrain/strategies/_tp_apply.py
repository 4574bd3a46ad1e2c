"""Tensor parallelism applied: torch's ``parallelize_module`` for each entry of a plan (``_tp_plan``), on the ``tp``
sub-mesh, then what the plan leaves implicit made explicit — the attentions' head counts set to this rank's share,
tied parameters tied again (``parallelize_module`` registers a new parameter per module), and every module left out
that holds parameters replicated as DTensors on the same mesh (torchtitan's ``NoParallel``: the optimizers' foreach
kernels and gradient clipping refuse a plain tensor beside DTensors, "got mixed torch.Tensor and DTensor").

``FirstInput`` and ``Replicated`` are ringtrain's own styles: PrepareModuleInput needs a layout for every positional
input (a block called with a mask and rotary frequencies has several), and torch has no style for "the same here".
"""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import RingtrainError


@dataclass
class Plan:
    """The plan applied: torch's plan (``styles``), the head counts set per rank, what the table shows."""

    styles: dict[str, Any]
    inferred: bool
    heads: dict[str, dict[str, int]] = field(default_factory=dict)  # attention -> {attribute: whole count}
    attention: list[str] = field(default_factory=list)
    trunk: str | None = None  # the container of the blocks
    blocks: list[str] = field(default_factory=list)  # its children: "blocks.0", "blocks.1", ...
    replicated: list[str] = field(default_factory=list)  # the leftovers, filled in by apply()


def cannot(name: str, why: str, fix: str) -> RingtrainError:
    return RingtrainError(f"tensor parallelism cannot cut the module {name or '(the model)'!r}: {why}", fix)


def inside(name: str, prefix: str) -> bool:
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


def matching(names: list[str], key: str) -> list[str]:
    parts = key.split(".")
    return [n for n in names if len(n.split(".")) == len(parts)
            and all(fnmatch.fnmatch(a, b) for a, b in zip(n.split("."), parts))]


def apply(model: nn.Module, plan: Plan, mesh: Any, tp: int) -> None:
    """Cut ``model`` in place: torch's ``parallelize_module`` on ``mesh`` (the ``tp`` sub-mesh), the attentions'
    head counts set per rank, tied parameters tied again, and every parameter left out replicated on the mesh."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    tied = _tied(model)
    names = [n for n, _ in model.named_modules() if n]
    for key, style in plan.styles.items():
        for name in (matching(names, key) if key else [""]):
            try:
                if isinstance(style, Style):
                    style._apply(model.get_submodule(name), mesh)
                else:
                    parallelize_module(model.get_submodule(name), mesh, style)
            except NotImplementedError as e:  # torch's word for a module type a style does not take
                module = model.get_submodule(name)
                raise cannot(name, f"{type(style).__name__} does not apply to a {type(module).__name__} ({e})",
                             "give that module a style torch supports for it (ColwiseParallel and RowwiseParallel "
                             "take nn.Linear and nn.Embedding), or leave it out of the plan: it is then replicated.") from e
    for name, heads in plan.heads.items():
        module = model.get_submodule(name)
        for attr, count in heads.items():
            setattr(module, attr, count // tp)
        _name_shape_errors(name, module, heads, tp)
    _tie_again(model, tied)
    plan.replicated = _replicate_the_rest(model, mesh)
    plain = [n for n, p in model.named_parameters() if not isinstance(p, DTensor)]
    if plain:  # the rest was replicated: nothing may be left a plain tensor
        raise RingtrainError(f"tensor parallelism left {plain[0]!r} a plain tensor", "report this as a ringtrain bug.")


def _tied(model: nn.Module) -> list[list[tuple[str, str]]]:
    """Each parameter registered in several places: [(module name, attribute), ...]."""
    owners: dict[int, list[tuple[str, str]]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for attr, p in module.named_parameters(recurse=False):
            owners.setdefault(id(p), []).append((name, attr))
    return [places for places in owners.values() if len({p for p in places}) > 1]


def _tie_again(model: nn.Module, groups: list[list[tuple[str, str]]]) -> None:
    """parallelize_module registers a new parameter per module: a tie (a head sharing the embedding's weight) would
    come apart into two copies that train separately. Each group is tied again where its parts are laid out alike."""
    from torch.distributed.tensor import DTensor

    for places in groups:
        params = [getattr(model.get_submodule(m), a) for m, a in places]
        layouts = {tuple(p.placements) if isinstance(p, DTensor) else None for p in params}
        if len(layouts) > 1:
            shown = ", ".join(f"{m}.{a}" if m else a for m, a in places)
            raise RingtrainError(f"the tied parameters {shown} would be cut differently by tensor parallelism "
                                 f"({sorted(map(str, layouts))})",
                                 "give the tied modules styles that cut the shared weight alike (a row-wise embedding "
                                 "and a column-wise head both cut the vocabulary), or untie them.")
        for m, a in places[1:]:
            setattr(model.get_submodule(m), a, params[0])


def _replicate_the_rest(model: nn.Module, mesh: Any) -> list[str]:
    """Every module subtree holding plain parameters and nothing cut: its parameters and buffers replicated as
    DTensors on ``mesh``, its inputs made replicated DTensors and its outputs local again (torchtitan's NoParallel)."""
    from torch.distributed.tensor import DTensor

    def cut(module: nn.Module) -> bool:
        return any(isinstance(p, DTensor) for p in module.parameters())

    memo: dict[int, nn.Parameter] = {}
    done: list[str] = []
    for name, module in model.named_modules():
        if any(inside(name, d) for d in done):
            continue
        own = [a for a, p in module.named_parameters(recurse=False) if not isinstance(p, DTensor)]
        if not own:
            continue
        if cut(module):
            raise cannot(name, f"it holds parameters of its own ({', '.join(own)}) beside cut ones, and its forward "
                         "would mix them", "move those parameters into a submodule of their own (which is then "
                         "replicated), or give a plan that covers this module.")
        Replicated(memo)._apply(module, mesh)
        done.append(name)
    return done


def _name_shape_errors(name: str, module: nn.Module, heads: dict[str, int], tp: int) -> None:
    """An attention whose forward sizes a view from the model's width stops at its first forward with torch's shape
    error; it is told what tensor parallelism changed and what the forward must do instead."""
    forward = module.forward

    @functools.wraps(forward)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return forward(*args, **kwargs)
        except RuntimeError as e:
            if "shape" not in str(e) and "size" not in str(e):
                raise
            counts = ", ".join(f"{a} {c} -> {c // tp}" for a, c in heads.items()) or "no head count found"
            raise RingtrainError(
                f"the attention {name or '(the model)'!r} failed under tensor parallelism ({e}): each rank computes "
                f"1/{tp} of its heads (q, k, v hold {tp}x fewer features; {counts})",
                "size its views from the tensors or the head count (q.view(B, T, -1, head_dim), "
                "y.view(B, T, -1)), not from the model's width, or give a plan of your own (TP(plan={...})).") from e

    module.forward = checked


class Style:
    """ringtrain's own styles, applied by ``apply`` itself (``table`` shows them in words)."""


class FirstInput(Style):
    """A module's first positional input moved from layout ``given`` to ``wanted`` (a local tensor again): the first
    block's slice of the sequence, or attention/MLP gathering it. Unlike PrepareModuleInput it leaves the other
    inputs (a mask, rotary frequencies) as they are, however many there are."""

    def __init__(self, given: Any, wanted: Any, tp: int):
        self.given, self.wanted, self.tp = given, wanted, tp

    def _apply(self, module: nn.Module, mesh: Any) -> nn.Module:
        from torch.distributed.tensor import DTensor

        def hook(_module: nn.Module, args: tuple, kwargs: dict) -> Any:
            if not args or not isinstance(args[0], torch.Tensor):
                return None
            x = args[0]
            if not isinstance(x, DTensor):
                if getattr(self.wanted, "dim", None) == 1 and x.dim() > 1 and x.shape[1] % self.tp:
                    raise RingtrainError(
                        f"sequence parallelism cuts the blocks' input along its sequence (dim 1) into {self.tp} "
                        f"equal parts, and this batch's sequence length {x.shape[1]} does not divide",
                        f"use sequences of a multiple of {self.tp} tokens, or drop sequence_parallel=True.")
                x = DTensor.from_local(x, mesh, (self.given,), run_check=False)
            return (x.redistribute(placements=(self.wanted,)).to_local(), *args[1:]), kwargs

        module.register_forward_pre_hook(hook, with_kwargs=True)
        return module

    def __repr__(self) -> str:
        return f"input {self.given} -> {self.wanted}"


class Replicated(Style):
    """A module the plan leaves out: the same on every rank, its parameters (tied ones once: ``memo``) and buffers
    replicated DTensors, its tensor inputs replicated DTensors, its outputs local tensors."""

    def __init__(self, memo: dict[int, nn.Parameter] | None = None):
        self.memo = memo if memo is not None else {}

    def _apply(self, module: nn.Module, mesh: Any) -> nn.Module:
        from torch.distributed.tensor import DTensor, Replicate
        from torch.utils._pytree import tree_map

        for sub in module.modules():
            for attr, p in list(sub.named_parameters(recurse=False)):
                if id(p) not in self.memo:
                    self.memo[id(p)] = nn.Parameter(DTensor.from_local(p.data, mesh, [Replicate()], run_check=False),
                                                    requires_grad=p.requires_grad)
                sub.register_parameter(attr, self.memo[id(p)])
            for attr, b in list(sub.named_buffers(recurse=False)):
                if b is not None and not isinstance(b, DTensor):
                    sub.register_buffer(attr, DTensor.from_local(b, mesh, [Replicate()], run_check=False),
                                        persistent=attr not in sub._non_persistent_buffers_set)

        def to_dtensor(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and not isinstance(x, DTensor):
                return DTensor.from_local(x, mesh, [Replicate()], run_check=False)
            return x

        module.register_forward_pre_hook(lambda _m, args, kwargs: (tree_map(to_dtensor, args),
                                                                   tree_map(to_dtensor, kwargs)), with_kwargs=True)
        module.register_forward_hook(lambda _m, _a, out: tree_map(
            lambda x: x.to_local() if isinstance(x, DTensor) else x, out))
        return module

    def __repr__(self) -> str:
        return "replicated"


