"""A metric of one rank's shard, printed as if it were the whole evaluation set's."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..nodes import callee_name, dotted, is_evalish, position
from ..script import Script
from .data import REDUCTIONS, _trains
from .loaders import bindings, iteration_loops, loaders

PRINTERS = {"print", "info", "log", "debug", "warning", "add_scalar", "add_scalars", "log_metrics", "set_postfix"}


def _refs(script: Script, expr: ast.AST, keys: set) -> list[str]:
    """The names in ``expr`` (in source order) bound to one of ``keys``."""
    found = [n for n in ast.walk(expr) if isinstance(n, (ast.Name, ast.Attribute)) and script.scope_of(n) in keys]
    names = [dotted(n) for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))]
    return list(dict.fromkeys(n for n in names if n))


def _derived(script: Script, fn: ast.AST, keys: set, after: ast.AST) -> set:
    """``keys`` plus the names computed from them after ``after`` (``acc = correct / total``)."""
    keys = set(keys)
    for _ in range(2):
        for node in ast.walk(fn):
            if isinstance(node, (ast.Assign, ast.AugAssign)) and position(node) > position(after):
                value = node.value
                if _refs(script, value, keys):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    keys |= {script.scope_of(t) for t in targets} - {None}
    return keys


def _prints(script: Script, fn: ast.AST, keys: set, after: ast.AST, depth: int = 1) -> Iterator[tuple[ast.Call, str]]:
    keys = _derived(script, fn, keys, after)
    for call in script.calls:
        if position(call) > position(after) and callee_name(call) in PRINTERS and script.function_of(call) is fn:
            names = [n for a in [*call.args, *(k.value for k in call.keywords)] for n in _refs(script, a, keys)]
            if names:
                yield call, ", ".join(f"`{n}`" for n in dict.fromkeys(names))
                return
    if depth and fn is not script.tree:
        returned = any(isinstance(n, ast.Return) and n.value is not None and _refs(script, n.value, keys)
                       for n in ast.walk(fn))
        if returned:
            for caller in script.callers(fn):
                stored = {script.scope_of(b) for b in bindings(script, caller)} - {None}
                if stored:
                    yield from _prints(script, script.function_of(caller), stored, caller, depth - 1)


def unreduced_metric(script: Script) -> Iterator[tuple]:
    if not script.is_distributed() or any(callee_name(c) in REDUCTIONS for c in script.calls):
        return
    reported: set[int] = set()
    for loader in loaders(script):
        if not loader.samplers or not any(is_evalish(t) for t in loader.names()):
            continue
        for loop in iteration_loops(script, loader.bindings):
            if _trains(script, loop):
                continue
            accumulated = {script.scope_of(n.target) for n in ast.walk(loop) if isinstance(n, ast.AugAssign)} - {None}
            if not accumulated:
                continue
            for call, name in _prints(script, script.function_of(loop), accumulated, loop):
                if id(call) in reported:
                    continue
                reported.add(id(call))
                yield (call,
                       f"possible: prints {name}, computed on this rank's shard of the evaluation set only (its "
                       "DistributedSampler gives each process 1/world_size of it), and nothing in the script "
                       "reduces it across ranks (no all_reduce or all_gather)",
                       "sum the counts over ranks before dividing: t = torch.tensor([correct, total], device=device); "
                       "dist.all_reduce(t); acc = t[0] / t[1]; in ringtrain, ring.all_reduce(correct, op='sum') "
                       "with an exact=True loader")
