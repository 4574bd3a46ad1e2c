"""Scripts that use ringtrain itself: which objects are Rings, whether they accumulate gradients,
which models ``ring.setup`` returns, and a loss divided twice (by the script and by ring.backward).

``ring.backward(loss)`` divides the loss by the accumulation window (``Ring(accumulate=k)``,
``ring.accumulate = k``, or the window ``Ring(global_batch=n)`` derives) before its backward, so a
script that keeps the single-GPU habit ``loss = loss / k`` divides twice.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ..nodes import callee_name, dotted, identifiers, is_const, keyword, position
from ..script import Script

# Names a script gives its own accumulation count: gradient_accumulation_steps, accum_iter, args.accumulate...
_ACCUMULATION = re.compile(r"accum")
# Ring(strategy=...) names whose models are torch's DistributedDataParallel or FSDP (rules/evaluation.py).
_DDP_STRATEGIES = {"auto", "ddp"}
_FSDP_STRATEGIES = {"fsdp"}


def ring_calls(script: Script) -> list[ast.Call]:
    return script.concept_calls.get("Ring", [])


def ring_origins(script: Script, expr: ast.AST | None, depth: int = 3) -> list[ast.Call]:
    """The ``Ring(...)`` calls ``expr`` may hold: through names, ``self.`` attributes and a helper's
    parameter (``def train(ring, model)`` called with the script's ring)."""
    if expr is None or depth == 0:
        return []
    found = [o for o in script.origins(expr) if isinstance(o, ast.Call) and script.names.concept(o) == "Ring"]
    if not found and isinstance(expr, ast.Name):
        found = [r for a in script.arguments(expr) for r in ring_origins(script, a, depth - 1)]
    return found


def is_ring(script: Script, expr: ast.AST | None) -> bool:
    return bool(ring_calls(script)) and bool(ring_origins(script, expr))


def _may_be_one(script: Script, k: ast.AST) -> bool:
    """``accumulate=k if no_sync else 1``: a window of one on some path (the script may divide there)."""
    return any(is_const(o, 1) for o in script.origins(k))


def accumulation(script: Script) -> dict[int, tuple[ast.AST, str, list[ast.expr]]]:
    """The Rings of this script that accumulate gradients — ``Ring(accumulate=k)`` (k never 1),
    ``Ring(global_batch=n)``, ``ring.accumulate = k`` —, by ``id`` of their ``Ring(...)`` call: where
    and how that is written, and the expressions that give the count (``k``, and the other targets of
    ``ring.accumulate = steps = ...``)."""
    found: dict[int, tuple[ast.AST, str, list[ast.expr]]] = {}
    for call in ring_calls(script):
        k = keyword(call, "accumulate")
        n = keyword(call, "global_batch")
        if k is not None and not _may_be_one(script, k):
            found[id(call)] = (call, f"Ring(accumulate={script.text(k)})", [k])
        elif n is not None and not is_const(n, None):
            found[id(call)] = (call, f"Ring(global_batch={script.text(n)})", [])
    if not ring_calls(script):
        return found
    for node in script.nodes:
        if not isinstance(node, ast.Assign) or _may_be_one(script, node.value):
            continue
        for target in node.targets:
            if isinstance(target, ast.Attribute) and target.attr == "accumulate":
                counts = [node.value, *(t for t in node.targets if t is not target)]
                for call in ring_origins(script, target.value):
                    found.setdefault(id(call), (node, f"{script.text(target)} = {script.text(node.value)}", counts))
    return found


def _counts(script: Script, divisor: ast.AST, counts: list[ast.expr]) -> bool:
    """Is ``divisor`` the script's accumulation count: the expression the Ring was given (or a name
    bound to it, or the same constant), ``ring.accumulate``, or a name that says so (``accum_steps``)?"""
    if isinstance(divisor, ast.Attribute) and divisor.attr == "accumulate" and is_ring(script, divisor.value):
        return True
    if any(_ACCUMULATION.search(name.lower()) for name in identifiers(divisor)):
        return True
    options = [divisor, *(o for o in script.origins(divisor) if o is not None)]
    for count in counts:
        for option in options:
            if isinstance(option, ast.Constant) and isinstance(count, ast.Constant):
                if isinstance(option.value, (int, float)) and option.value == count.value \
                        and not isinstance(option.value, bool):
                    return True
            elif ast.dump(option) == ast.dump(count):
                return True
            elif isinstance(option, (ast.Name, ast.Attribute)) and isinstance(count, (ast.Name, ast.Attribute)) \
                    and script.aliases(option) & script.aliases(count):
                return True
    return False


def _divisions(script: Script, expr: ast.AST, at: ast.AST, counts: list[ast.expr], seen: set[int],
               depth: int = 4) -> Iterator[tuple[ast.AST, ast.AST]]:
    """Where the value of ``expr`` (read at ``at``) was divided by the accumulation count: a ``x / k``
    in it, or in what its names were assigned before ``at`` in the same function (``loss = loss / k``,
    ``loss /= k``), or in what a local function it calls returns. Yields (the division, the divisor)."""
    if depth == 0 or id(expr) in seen:
        return
    seen.add(id(expr))
    for node in ast.walk(expr):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _counts(script, node.right, counts):
            yield node, node.right
        elif isinstance(node, ast.Call):
            for value in script.returned(node):
                yield from _divisions(script, value, value, counts, seen, depth - 1)
        elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            key = script.scope_of(node)
            for stmt, value in script.assignments.get(key, []) if key else []:
                if position(stmt) >= position(at) or script.function_of(stmt) is not script.function_of(at):
                    continue  # a division after the backward (for the log) never reaches it
                if isinstance(stmt, ast.AugAssign):
                    if isinstance(stmt.op, ast.Div) and _counts(script, stmt.value, counts):
                        yield stmt, stmt.value
                elif value is not None:
                    yield from _divisions(script, value, stmt, counts, seen, depth - 1)


def loss_divided_with_ring_accumulate(script: Script) -> Iterator[tuple]:
    accumulating = accumulation(script)
    if not accumulating:
        return
    reported: set[int] = set()
    for call in script.calls:
        if callee_name(call) != "backward" or not isinstance(call.func, ast.Attribute) or not call.args:
            continue
        windows = [accumulating[id(r)] for r in ring_origins(script, call.func.value) if id(r) in accumulating]
        if not windows:
            continue
        where, how, counts = windows[0]
        ring = dotted(call.func.value) or "ring"
        for division, divisor in _divisions(script, call.args[0], call, counts, set()):
            if id(division) in reported:
                continue
            reported.add(id(division))
            k = script.text(divisor)
            yield (division,
                   f"the loss is divided by `{k}` before {ring}.backward (line {call.lineno}), and this Ring "
                   f"accumulates ({how}, line {where.lineno}): {ring}.backward divides the loss by the accumulation "
                   f"window itself, so it is divided twice and every gradient comes out {k} times too small, "
                   "silently (SGD steps that much shorter; clip_grad_norm_ and Adam's eps see the shrunken "
                   "gradients)",
                   f"drop the division and pass the micro-batch's loss as it is: {ring}.backward(loss) divides it "
                   "by the window; print loss.item() for the per-micro-batch loss. (The division belongs to "
                   "plain PyTorch accumulation, loss = loss / k; loss.backward(), without ring.backward.)")


def strategy_kind(script: Script, ring: ast.AST | None) -> str | None:
    """"ddp" or "fsdp": what a Ring's models are wrapped in (the default "auto" is DDP on several
    processes; a strategy the file computes, such as an environment variable, is read as the default);
    None for a single process, DataParallel, Horovod, a pipeline, or DDP(broadcast_buffers=False)."""
    kinds = set()
    for call in ring_origins(script, ring):
        strategy = keyword(call, "strategy", 0)
        if strategy is None:
            kinds.add("ddp")
        elif isinstance(strategy, ast.Constant):
            name = str(strategy.value).lower()
            kinds.add("ddp" if name in _DDP_STRATEGIES else "fsdp" if name in _FSDP_STRATEGIES else None)
        elif isinstance(strategy, ast.Call) and (script.names.path(strategy.func) or "").startswith("ringtrain."):
            last = callee_name(strategy)
            if last == "DDP" and not is_const(keyword(strategy, "broadcast_buffers"), False):
                kinds.add("ddp")
            kinds.add("fsdp" if last == "FSDP" else None)
        else:
            kinds.add("ddp")
    kinds.discard(None)
    return "fsdp" if kinds == {"fsdp"} else "ddp" if "ddp" in kinds else None


def setup_models(script: Script) -> Iterator[tuple[ast.expr, str, ast.Call]]:
    """The models ``ring.setup`` returns (``model, optimizer = ring.setup(model, optimizer)``), with
    what they are wrapped in (see :func:`strategy_kind`) and the setup call."""
    if not ring_calls(script):
        return
    for call in script.calls:
        if callee_name(call) != "setup" or not isinstance(call.func, ast.Attribute):
            continue
        kind = strategy_kind(script, call.func.value)
        if kind is None or (kind == "ddp" and is_const(keyword(call, "broadcast_buffers"), False)):
            continue
        parent = script.parent.get(call)
        if isinstance(parent, ast.Assign):
            for target in parent.targets:
                first = target.elts[0] if isinstance(target, (ast.Tuple, ast.List)) and target.elts else target
                if isinstance(first, (ast.Name, ast.Attribute)):
                    yield first, kind, call
