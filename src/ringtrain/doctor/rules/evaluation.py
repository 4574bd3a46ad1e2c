"""A forward of the wrapped model on one rank only: an evaluation under ``if rank == 0:``.

DistributedDataParallel's forward broadcasts the module's buffers (BatchNorm statistics, a
registered mask; ``broadcast_buffers=True``, the default) from rank 0 when the forward before it
will synchronise gradients — torch's ``_pre_forward`` reads ``require_forward_param_sync``, which
every forward with gradients on sets and a forward under ``no_grad`` clears. That broadcast is a
collective: run on one rank, it is matched with whatever collective the other ranks reach next.
Measured with torch 2.13, Gloo, two processes, a model with a registered buffer (and with
BatchNorm): an evaluation under ``no_grad`` on rank 0 that the other ranks follow with a forward of
the model runs — its one broadcast stands in for the one rank 0's next forward then skips —; one
after the last training step fails (the other ranks finish: "Connection closed by peer"; or wait in
a barrier: a timeout); one with gradients on broadcasts in every forward and hangs. A model without
buffers broadcasts nothing. FSDP's forward all-gathers the parameters: always a collective.

So the rule reports a one-rank forward of a DDP model when gradients are on, or when some path of
the other ranks after the rank check reaches a collective or the end before a forward of the
model ("possible" when only the loops' end does and the check asks more than the rank, as in
``if step % 100 == 0 and rank == 0:``); and any one-rank forward of an FSDP model. Whether the model
has buffers is rarely in the file, so the message says "with buffers". ``ring.setup``'s DDP model is
reported only with gradients on: ringtrain skips the broadcast of a forward under ``no_grad``
(strategies/ddp.py), so rank 0 may evaluate it alone.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..nodes import callee_name, dotted, is_const, keyword, position
from ..ranks import decorator_guards, rank_guard, singles_out_one_rank
from ..script import FUNCTION, LOOP, Script
from .buffers import Buffers
from .ring import is_ring, setup_models
from .shards import Sharding

Key = tuple[ast.AST, str]
_GRAD_OFF = {"no_grad", "inference_mode"}
_UNWRAP = {"unwrap", "unwrap_model"}  # ring.unwrap(model), accelerate's unwrap_model(model)
# ringtrain's collectives, called on a Ring (ring.log reduces what it logs; ring.save writes with every rank).
_RING_COLLECTIVES = {"all_reduce", "reduce", "all_gather", "gather", "gather_object", "broadcast",
                     "broadcast_object", "barrier", "log", "save", "stats", "load"}
_BARRIERS = ("torch.distributed.barrier", "torch.distributed.monitored_barrier")
_LEAVE_GROUP = ("torch.distributed.destroy_process_group",)

_HINT_DDP = ("evaluate on every rank and reduce the metric (each rank a shard of the evaluation set, then "
             "dist.all_reduce of the sums; in ringtrain, ring.loader(..., exact=True) and ring.all_reduce), or on "
             "one rank through the unwrapped module, which runs no collective: raw_model = model.module, "
             "raw_model(x) (ringtrain: ring.unwrap(model)); DDP(..., broadcast_buffers=False) also stops the "
             "broadcast, if every rank keeps its own buffers in step")
_HINT_FSDP = ("run the evaluation forward on every rank (each shard of the evaluation set, then dist.all_reduce "
              "of the sums; in ringtrain, ring.loader(..., exact=True) and ring.all_reduce), keeping only the "
              "printing under the rank check; an FSDP model has no unwrapped copy to run on one rank")


def _options(value: ast.AST | None) -> list[ast.expr]:
    """What a value may be, read as names: both sides of ``a if c else b``, each of ``a or b``."""
    if isinstance(value, ast.IfExp):
        return _options(value.body) + _options(value.orelse)
    if isinstance(value, ast.BoolOp):
        return [o for v in value.values for o in _options(v)]
    return [value] if value is not None else []


def _unwraps(expr: ast.AST) -> bool:
    """``model.module``, ``ring.unwrap(model)``: the plain module inside the wrapper."""
    if isinstance(expr, ast.Attribute) and expr.attr == "module":
        return True
    return isinstance(expr, ast.Call) and callee_name(expr) in _UNWRAP


def _turns_grad_off(expr: ast.AST) -> bool:
    """``torch.no_grad()``, ``@torch.no_grad``, ``torch.inference_mode()``, ``torch.set_grad_enabled(False)``."""
    if isinstance(expr, ast.Call):
        name = callee_name(expr)
        if name == "set_grad_enabled":
            return bool(expr.args) and is_const(expr.args[0], False)
        return name in _GRAD_OFF
    return isinstance(expr, (ast.Name, ast.Attribute)) and (dotted(expr) or "").split(".")[-1] in _GRAD_OFF


def _is_method(script: Script, fn: ast.AST) -> bool:
    return isinstance(script.parent.get(fn), ast.ClassDef)


def _calls_of(script: Script, fn: ast.AST) -> list[ast.Call]:
    """The calls of ``fn`` in this file: ``f(...)`` for a function, ``x.f(...)`` for a method (so
    ``model.train()`` is no call of a ``def train``), a class's name for its ``__init__``."""
    if getattr(fn, "name", "") == "__init__":
        return script.call_sites(fn)
    method = _is_method(script, fn)
    return [c for c in script.call_sites(fn) if isinstance(c.func, ast.Attribute) == method]


def _callees(script: Script, call: ast.Call) -> list[ast.AST]:
    """The ``def``s of this file ``call`` runs, matched as :func:`_calls_of` matches them."""
    return [d for d in script.callees(call) if call in _calls_of(script, d)]


def _statement(script: Script, node: ast.AST) -> ast.AST:
    return node if isinstance(node, ast.stmt) else next((a for a in script.ancestors(node) if isinstance(a, ast.stmt)),
                                                        node)


class _Models:
    """The script's DDP- and FSDP-wrapped models, by binding: ``model = DDP(model)``, FSDP1's wrap,
    ``fully_shard(model)``, ``model, optimizer = ring.setup(model, optimizer)``."""

    def __init__(self, script: Script):
        self.script = script
        self.wraps: dict[Key, tuple[str, ast.AST]] = {}
        sharding = Sharding(script)
        for call in script.concept_calls.get("DDP", []):
            if not is_const(keyword(call, "broadcast_buffers"), False):
                for key in sharding.stored_in(call):
                    self.wraps.setdefault(key, ("ddp", call))
        for shard in sharding.shards:
            for key in shard.keys:
                self.wraps.setdefault(key, ("fsdp", shard.call))
        for target, kind, call in setup_models(script):
            if (key := script.scope_of(target)) is not None:
                # ring.setup's DDP skips the buffer broadcast of a forward under no_grad (strategies/ddp.py)
                self.wraps.setdefault(key, ("ring-ddp" if kind == "ddp" else kind, call))

    def kind(self, expr: ast.AST, depth: int = 4) -> tuple[str, ast.AST] | None:
        """("ddp" or "fsdp", the wrap) when ``expr`` names a wrapped model: its binding, or one it is
        assigned or passed from; None when it may be the unwrapped module (``raw_model = model.module
        if ddp else model``) or is nothing wrapped."""
        script = self.script
        key = script.scope_of(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else None
        if key is None:
            return None
        values = script.values(expr) + script.arguments(expr)
        if any(_unwraps(o) for v in values for o in _options(v)):
            return None
        if key in self.wraps:
            return self.wraps[key]
        if depth:
            for value in values:
                for option in _options(value):
                    if (found := self.kind(option, depth - 1)) is not None:
                        return found
        return None

    def forwards(self) -> Iterator[tuple[ast.Call, str, ast.AST]]:
        """Calls of a wrapped model (its forward), after the wrap when both are in one function."""
        for call in self.script.calls:
            found = self.kind(call.func)
            if found is None:
                continue
            kind, wrap = found
            if self.script.function_of(call) is self.script.function_of(wrap) and position(call) < position(wrap):
                continue  # the plain model, before it was wrapped
            yield call, kind, wrap


class _Walk:
    """Where the other ranks go after they part from the one that evaluates: the statements that
    follow the rank check, through loops (the next iteration, and the exit), ``break``, ``continue``,
    ``return`` and the end of a function (after each call of it). Each path ends at the first
    forward of a wrapped model ("forward"), collective ("collective") or the end of the run ("end")."""

    def __init__(self, models: _Models):
        self.models = models
        self.script = models.script
        self.seen: set[int] = set()
        self.found: list[tuple[str, ast.AST | None, ast.AST | None]] = []  # (event, where, the jump on the way)
        self.via: ast.AST | None = None

    def start(self, site: ast.AST, other: list[ast.stmt]) -> None:
        self.seen.add(id(site))
        if other:
            self.run(other, site, "other", 3)
        else:
            self.after(site, 3)

    def after(self, stmt: ast.AST, depth: int) -> None:
        parent = self.script.parent.get(stmt)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list):
                for i, s in enumerate(block):
                    if s is stmt:
                        self.run(block[i + 1:], parent, field, depth)
                        return
        # not in a statement list this walk knows: no judgement on this path

    def run(self, stmts: list[ast.stmt], owner: ast.AST, field: str, depth: int) -> None:
        for s in stmts:
            if id(s) in self.seen:
                return
            self.seen.add(id(s))
            event = self.classify(s)
            if event is not None:
                self.found.append((event[0], event[1], self.via))
                return
            if isinstance(s, (ast.Break, ast.Continue, ast.Return)):
                self.jump(s, depth)
                return
            if isinstance(s, ast.Raise):
                return  # an error ends this path; nothing to judge
            for jump in self._jumps(s):
                self.jump(jump, depth)
        self.leave(owner, field, depth)

    def leave(self, owner: ast.AST, field: str, depth: int) -> None:
        script = self.script
        if field == "other":  # the other branch of the rank check: then after the `if`
            self.after(owner, depth)
        elif isinstance(owner, LOOP) and field == "body":
            self.run(owner.body, owner, "body", depth)  # the next iteration (a second lap stops at `seen`)
            if not _forever(owner):
                self.jump(owner, depth)  # the last one: out of the loop
        elif isinstance(owner, FUNCTION):
            self.end_function(owner, depth)
        elif isinstance(owner, ast.Module):
            self.found.append(("end", None, self.via))
        elif isinstance(owner, ast.ExceptHandler) or type(owner).__name__ == "match_case":
            self.after(script.parent[owner], depth)
        else:
            self.after(owner, depth)

    def jump(self, stmt: ast.AST, depth: int) -> None:
        # the first jump names the path; of loops left in turn, the outermost
        before = self.via
        self.via = stmt if self.via is None or (isinstance(self.via, LOOP) and isinstance(stmt, LOOP)) else self.via
        try:
            self._jump(stmt, depth)
        finally:
            self.via = before

    def _jump(self, stmt: ast.AST, depth: int) -> None:
        script = self.script
        if isinstance(stmt, LOOP):  # its last iteration ends
            self.after(stmt, depth)
        elif isinstance(stmt, ast.Return):
            self.end_function(script.function_of(stmt), depth)
        elif isinstance(stmt, (ast.Break, ast.Continue)):
            loops = script.enclosing_loops(stmt)
            if not loops:
                return
            if isinstance(stmt, ast.Continue):
                self.run(loops[0].body, loops[0], "body", depth)
                if _forever(loops[0]):
                    return
            self.after(loops[0], depth)
        else:  # sys.exit(), exit()
            self.found.append(("end", stmt, self.via))

    def end_function(self, fn: ast.AST, depth: int) -> None:
        script = self.script
        if fn is script.tree:
            self.found.append(("end", None, self.via))
            return
        callers = _calls_of(script, fn)
        if not callers:
            self.found.append(("end", None, self.via))  # a process's function (mp.spawn's), or one called elsewhere
            return
        if depth == 0:
            return
        for call in callers:
            self.after(_statement(script, call), depth - 1)

    def _jumps(self, stmt: ast.stmt) -> Iterator[ast.AST]:
        """``break``/``continue`` of the loop around ``stmt``, ``return`` and ``sys.exit()`` inside a
        compound statement: a way out that may be taken."""
        stack = [(c, isinstance(stmt, LOOP)) for c in ast.iter_child_nodes(stmt)]
        while stack:
            node, in_loop = stack.pop()
            if isinstance(node, (*FUNCTION, ast.ClassDef)):
                continue
            if isinstance(node, (ast.Break, ast.Continue)) and not in_loop:
                yield node
            elif isinstance(node, ast.Return):
                yield node
            elif isinstance(node, ast.Call) and callee_name(node) in ("exit", "_exit"):
                yield node
            stack += [(c, in_loop or isinstance(node, LOOP)) for c in ast.iter_child_nodes(node)]

    def classify(self, stmt: ast.stmt) -> tuple[str, ast.Call] | None:
        """What the other ranks meet first in ``stmt``, and the call: a forward of a wrapped model
        (taken to come first when there is one), a collective, the group's end; None: none of these."""
        script = self.script
        collective = None
        for call in _every_rank_calls(script, stmt):
            if self.models.kind(call.func) is not None:
                return "forward", call
            path = script.names.path(call.func) or ""
            concept = script.names.concept(call) or ""
            if path in _LEAVE_GROUP:
                collective = collective or ("end", call)
            elif concept.startswith("collective.") or path in _BARRIERS or (
                    callee_name(call) in _RING_COLLECTIVES and isinstance(call.func, ast.Attribute)
                    and is_ring(script, call.func.value)):
                collective = collective or ("collective", call)
        return collective


def _every_rank_calls(script: Script, node: ast.AST, depth: int = 2) -> Iterator[ast.Call]:
    """The calls in ``node`` that no rank check inside it keeps from any rank, and, ``depth`` levels
    deep, those of the file's functions they call (each without a rank check of its own)."""
    seen: set[int] = set()
    frontier = [node]
    for level in range(depth + 1):
        following = []
        for container in frontier:
            if id(container) in seen:
                continue
            seen.add(id(container))
            for call in (n for n in ast.walk(container) if isinstance(n, ast.Call)):
                if any(isinstance(b, ast.If) and singles_out_one_rank(b.test) and script.inside(b, container)
                       for b, _ in script.branches_around(call)):
                    continue
                yield call
                if level < depth:
                    following += _callees(script, call)
        frontier = following


def _forever(loop: ast.AST) -> bool:
    """``while True:``: left only by ``break`` or ``return``."""
    return isinstance(loop, ast.While) and isinstance(loop.test, ast.Constant) and bool(loop.test.value)


def parting(script: Script, node: ast.AST, depth: int = 3) -> list[tuple[ast.AST, int, list]] | None:
    """Where the ranks that do not run ``node`` part from the one that does: (the statement after
    which they go on, the line of the rank check, what they run instead — the other branch of the
    check). None when some path this file shows runs ``node`` on every rank, or none is visible."""
    for branch, in_body in script.branches_around(node):
        if isinstance(branch, ast.If) and singles_out_one_rank(branch.test):
            return [(branch, branch.lineno, branch.orelse if in_body else branch.body)]
    fn = script.function_of(node)
    if fn is script.tree or isinstance(fn, ast.Lambda):
        return None
    # `if rank != 0: return` before it, or @rank_zero_only: the others leave the function at once
    guarded, lines = rank_guard(script, node, depth=0)
    if guarded:
        line = lines[0] if lines else next((d.lineno for d in fn.decorator_list if decorator_guards(d)), fn.lineno)
        return [(_statement(script, c), line, []) for c in _calls_of(script, fn)] or None
    if depth == 0:
        return None
    callers = _calls_of(script, fn)
    if not callers:
        return None
    sites = []
    for call in callers:
        found = parting(script, call, depth - 1)
        if found is None:
            return None
        sites += found
    return sites


def _grad_off(script: Script, node: ast.AST, depth: int = 3) -> bool | None:
    """Does ``node`` run with gradients off (``with torch.no_grad():``, ``@torch.no_grad()``, every call
    of its function so)? A function never called in this file runs with torch's default, gradients on;
    None: some calls of it turn them off, or the calls are too deep to follow."""
    for a in script.ancestors(node):
        if isinstance(a, (ast.With, ast.AsyncWith)) and any(
                _turns_grad_off(o) for i in a.items for o in [i.context_expr, *script.origins(i.context_expr)]
                if o is not None):
            return True  # `with ctx:` where ctx may be torch.no_grad(): read as off (the milder reading)
        if isinstance(a, FUNCTION):
            if any(_turns_grad_off(d) for d in getattr(a, "decorator_list", [])):
                return True
            break
    fn = script.function_of(node)
    if fn is script.tree:
        return False
    callers = _calls_of(script, fn)
    if not callers:
        return False
    if depth == 0:
        return None
    verdicts = [_grad_off(script, c, depth - 1) for c in callers]
    return False if False in verdicts else True if all(verdicts) else None


def _quiet_before(models: _Models, site: ast.AST) -> bool:
    """Does the statement before the rank check that runs the model on every rank last (may) run it
    with gradients off (a validation on all ranks)? Then DDP's next forward broadcasts nothing."""
    script = models.script
    parent = script.parent.get(site)
    blocks = [b for f in ("body", "orelse", "finalbody") if isinstance(b := getattr(parent, f, None), list)
              and any(s is site for s in b)]
    if not blocks:
        return False
    index = next(i for i, s in enumerate(blocks[0]) if s is site)
    for stmt in reversed(blocks[0][:index]):
        forwards = [c for c in _every_rank_calls(script, stmt) if models.kind(c.func) is not None]
        if forwards:
            return any(_grad_off(script, c) for c in forwards)
    return False


def _twin(models: _Models, other: list[ast.stmt]) -> bool:
    """Does the other branch of the rank check run a forward of a wrapped model too?"""
    return any(models.kind(c.func) is not None for stmt in other for c in _every_rank_calls(models.script, stmt))


def _describe(event: str, node: ast.AST | None, via: ast.AST | None) -> str:
    """"the end of the run", "dist.barrier() (line 40), a collective", with the jump that leads there."""
    if node is None:
        what = "the end of the run"
    elif event == "collective" or callee_name(node) == "destroy_process_group":
        what = f"{dotted(node.func) or callee_name(node)}() (line {node.lineno})" + (
            ", a collective," if event == "collective" else "")
    else:
        what = f"the end of the run ({callee_name(node)}() at line {node.lineno})"
    if isinstance(via, LOOP):
        what += f"{'' if what.endswith(',') else ','} once the loop at line {via.lineno} ends,"
    elif via is not None and not isinstance(via, ast.Call):
        what += f"{'' if what.endswith(',') else ','} through the `{type(via).__name__.lower()}` at line {via.lineno},"
    return what


def _conditional(script: Script, site: ast.AST) -> bool:
    """``if step % 100 == 0 and rank == 0:``: the check asks more than the rank, so its last time may
    not be the loop's last iteration."""
    test = getattr(site, "test", None)
    return isinstance(test, ast.BoolOp) and any(not singles_out_one_rank(v) for v in test.values)


def eval_on_one_rank_through_ddp(script: Script) -> Iterator[tuple]:
    if not script.has_concept("DDP", "FSDP", "fully_shard", "Ring"):
        return
    models = _Models(script)
    if not models.wraps:
        return
    for call, kind, wrap in models.forwards():
        sites = parting(script, call)
        if not sites or all(_twin(models, other) for _, _, other in sites):
            continue  # `if rank == 0: out = model(x) ... else: out = model(x)`: every rank runs a forward
        line = sites[0][1]
        name = dotted(call.func) or "model"
        if kind == "fsdp":
            yield (call,
                   f"`{name}(...)` runs the FSDP-sharded model only on the process(es) picked by the rank check at "
                   f"line {line}: every FSDP forward all-gathers the parameters from all ranks, a collective the "
                   "other ranks never join, and the job hangs",
                   _HINT_FSDP)
            continue
        buffers = _buffers(script, wrap)
        if _grad_off(script, call) is False:
            yield (call,
                   f"`{name}(...)` runs the DistributedDataParallel model only on the process(es) picked by the rank "
                   f"check at line {line}, with gradients on: every such forward broadcasts the module's buffers "
                   "(BatchNorm statistics, a registered mask; DDP's broadcast_buffers, on by default) from rank 0, "
                   f"a collective the other ranks never join — {buffers[0]}",
                   _HINT_DDP, buffers[1])
            continue
        if kind == "ring-ddp":
            continue  # ringtrain's DDP runs no collective in a forward under no_grad: rank 0 may evaluate alone
        walk = _Walk(models)
        for site, _, other in sites:
            walk.start(site, other)
        unmatched = [found for found in walk.found if found[0] != "forward"]
        if not unmatched or any(_quiet_before(models, site) for site, _, _ in sites):
            continue
        certain = [found for found in unmatched if not isinstance(found[2], LOOP)]
        possible = "" if certain or not any(_conditional(script, site) for site, _, _ in sites) else "possible: "
        yield (call,
               f"{possible}`{name}(...)` runs the DistributedDataParallel model only on the process(es) picked by the rank "
               f"check at line {line}: DDP's first forward after a training step broadcasts the module's buffers "
               "(BatchNorm statistics, a registered mask; broadcast_buffers, on by default) from rank 0, even under "
               "no_grad, and the broadcast is matched with whatever the other ranks call next — here they can "
               f"reach {_describe(*(certain or unmatched)[0])} with no forward of the model before it: {buffers[0]}",
               _HINT_DDP, buffers[1])


def _buffers(script: Script, wrap: ast.AST) -> tuple[str, str | None]:
    """The end of the message, and the severity: an error where the file shows the model has buffers, a warning
    (whose text says the condition) where it does not."""
    module = keyword(wrap, "module", 0) if isinstance(wrap, ast.Call) else None
    if isinstance(wrap, ast.Call) and callee_name(wrap) == "setup":
        module = keyword(wrap, "model", 0)
    verdict = Buffers(script).of(module)
    if verdict is not None and verdict[0] == "yes":
        what = "a BatchNorm layer" if callee_name(verdict[1]) != "register_buffer" else "a registered buffer"
        return (f"this model has buffers ({what}, line {verdict[1].lineno}): a hang (NCCL) or a failed collective "
                "(Gloo)"), None
    if verdict is not None:
        test = next((b for b, _ in script.branches_around(verdict[1]) if isinstance(b, ast.If)), None)
        shown = (f"this model registers its buffer (line {verdict[1].lineno}) only under `if {script.text(test.test)}:` "
                 f"(line {test.lineno})") if test is not None else "the file shows only some of them"
    else:
        shown = "the file does not show the model's layers"
    return (f"a hang (NCCL) or a failed collective (Gloo) if the model has buffers (a registered mask, BatchNorm "
            f"statistics) and broadcast_buffers is on, as by default; {shown}, and a model without buffers "
            "broadcasts nothing"), "warning"
