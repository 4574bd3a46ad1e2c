"""Scripts that use ringtrain's Ring but go around it: ``loss.backward()`` where the Ring accumulates or runs
float16, an optimizer that ``ring.setup`` is not given, ``ring.save``/``ring.load`` under a rank-0 check.

What the Ring does that these miss (src/ringtrain/ring.py, loop/step.py, loop/optim.py):

* the optimizer ``ring.setup`` is given steps only on accumulation boundaries, and only ``ring.backward`` moves
  the window (``Step.next_backward``): after a plain ``loss.backward()`` the window never opens, so every
  ``optimizer.step()`` steps; and only ``ring.backward`` scales the loss for the float16 GradScaler, which that
  optimizer's step unscales (divides by the scale) all the same;
* FSDP puts sharded parameters in place of the model's in ``ring.setup``; the optimizer it is given is pointed at
  them, any other one keeps the old tensors;
* ``ring.save`` and ``ring.load`` run on every rank (rank 0 writes, and every rank waits for its word, a
  broadcast): under ``if ring.is_main:`` the other ranks never come.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..nodes import callee_name, dotted, is_const, keyword, position
from ..script import Script, name_options
from .evaluation import parting
from .model import _exclusive
from .ring import is_ring, ring_calls, ring_origins
from .shards import Sharding, related

# Ring(precision=...) spellings that mean float16 with its GradScaler (loop/precision.py's aliases).
_FP16 = {"16-mixed", "fp16", "16", "float16", "half"}
_OPTIMIZERS = ("torch.optim.", "torch.distributed.optim.", "bitsandbytes.optim.", "apex.optimizers.")
# A method of the script's model that builds its optimizer on its parameters (nanoGPT's GPT.configure_optimizers).
_BUILDS_OPTIMIZER = {"configure_optimizers", "configure_optimizer", "build_optimizer", "make_optimizer"}


def _fp16(script: Script, precision: ast.AST | None) -> tuple[bool | None, ast.AST | None]:
    """True: float16 on every path the file shows; None: on some (``precision=dtype``, dtype 'float16' or not);
    False: never. With the float16 value the file shows."""
    if precision is None:
        return False, None
    found, value = [], None
    for origin in script.origins(precision):
        if isinstance(origin, ast.Constant) and isinstance(origin.value, (str, int)) and not isinstance(origin.value, bool):
            found.append(str(origin.value).lower() in _FP16)
        elif isinstance(origin, ast.Attribute) and origin.attr in ("float16", "half") \
                and (script.names.path(origin) or "").startswith("torch."):
            found.append(True)
        else:
            found.append(False)
        value = value or (origin if found[-1] else None)
    return (True if found and all(found) else None if any(found) else False), value


def _not_one(script: Script, k: ast.AST) -> bool:
    """An accumulation window that may be more than one: anything but a literal 1 on every path."""
    return not all(is_const(o, 1) for o in script.origins(k))


def ring_windows(script: Script) -> dict[int, list[tuple[str, ast.AST, str]]]:
    """What makes each Ring (by ``id`` of its ``Ring(...)`` call) need ``ring.backward``: ("accumulate", where,
    how it is written) — accumulate=k (k not a literal 1), global_batch=n, ``ring.accumulate = k`` — and
    ("fp16", where, how) — precision='16-mixed', 'fp16', 'float16', torch.float16 (how says "float16 wherever
    dtype is 'float16'" when the file leaves it open)."""
    found: dict[int, list[tuple[str, ast.AST, str]]] = {}
    for call in ring_calls(script):
        reasons = found.setdefault(id(call), [])
        k, n, p = keyword(call, "accumulate"), keyword(call, "global_batch"), keyword(call, "precision")
        if k is not None and _not_one(script, k):
            reasons.append(("accumulate", call, f"Ring(accumulate={script.text(k)})"))
        elif n is not None and not is_const(n, None):
            reasons.append(("accumulate", call, f"Ring(global_batch={script.text(n)})"))
        fp16, value = _fp16(script, p)
        if fp16:
            reasons.append(("fp16", call, f"Ring(precision={script.text(p)})"))
        elif fp16 is None and value is not None:
            reasons.append(("fp16", call, f"Ring(precision={script.text(p)}), float16 wherever {script.text(p)} is "
                                          f"{script.text(value)}"))
    for node in script.nodes:
        if not isinstance(node, ast.Assign) or not _not_one(script, node.value):
            continue
        for target in node.targets:
            if isinstance(target, ast.Attribute) and target.attr == "accumulate":
                for call in ring_origins(script, target.value):
                    found.setdefault(id(call), []).append(
                        ("accumulate", node, f"{script.text(target)} = {script.text(node.value)}"))
    return {k: v for k, v in found.items() if v}


def given_to_setup(script: Script) -> dict[tuple[ast.AST, str], ast.Call]:
    """The bindings of the optimizers handed to a ``ring.setup`` (the argument, and what setup's result is
    unpacked into), each with its setup call: ``model, optimizer = ring.setup(model, optimizer)``. setup wraps
    the optimizer object itself, so the name it was built in is the ring's optimizer too."""
    found: dict[tuple[ast.AST, str], ast.Call] = {}
    for call in _setups(script):
        given = keyword(call, "optimizer", 1)
        if isinstance(given, (ast.Name, ast.Attribute)):
            for key in script.aliases(given):
                found.setdefault(key, call)
        parent = script.parent.get(call)
        if given is not None and isinstance(parent, ast.Assign):
            for target in parent.targets:
                if isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) > 1 \
                        and (key := script.scope_of(target.elts[1])) is not None:
                    found.setdefault(key, call)
    return found


def _setups(script: Script) -> list[ast.Call]:
    return [c for c in script.calls if callee_name(c) == "setup" and isinstance(c.func, ast.Attribute)
            and is_ring(script, c.func.value)]


def _setup_of(script: Script, expr: ast.AST | None, given: dict, depth: int = 3) -> ast.Call | None:
    """The ``ring.setup`` an optimizer expression was handed to: through names, ``self.`` attributes and a
    helper's parameter."""
    if not isinstance(expr, (ast.Name, ast.Attribute)) or depth == 0:
        return None
    for key in script.aliases(expr):
        if key in given:
            return given[key]
    names = [expr, *(o for v in script.values(expr) for o in name_options(v))]
    for name in names:
        for argument in script.arguments(name):
            if (found := _setup_of(script, argument, given, depth - 1)) is not None:
                return found
    return None


def _stepped(call: ast.Call) -> ast.expr | None:
    """The optimizer an ``optimizer.step()`` or ``scaler.step(optimizer)`` steps; None for anything else (a
    scheduler's step)."""
    if callee_name(call) != "step" or not isinstance(call.func, ast.Attribute):
        return None
    receiver = (dotted(call.func.value) or "").lower()
    if "sched" in receiver:
        return None
    if call.args and isinstance(call.args[0], (ast.Name, ast.Attribute)):
        return call.args[0]  # scaler.step(optimizer)
    return call.func.value


def _plain_backwards(script: Script) -> Iterator[ast.Call]:
    """``loss.backward()``, ``scaler.scale(loss).backward()``: a backward that is not ``ring.backward``."""
    for call in script.calls:
        if callee_name(call) != "backward" or not isinstance(call.func, ast.Attribute):
            continue
        receiver = call.func.value
        if is_ring(script, receiver) or (script.names.path(receiver) or "").startswith("torch."):
            continue  # ring.backward(loss); torch.autograd.backward(...)
        yield call


def _branches(script: Script, node: ast.AST, loop: ast.AST | None) -> set[tuple[int, bool]]:
    return {(id(b), side) for b, side in script.branches_around(node) if loop is None or script.inside(b, loop)}


def _every_time(script: Script, backward: ast.AST, step: ast.AST) -> bool:
    """Does ``step`` run each time ``backward`` does: the same innermost loop, and no ``if`` around the step
    (inside that loop) that the backward is not under too? A loop that accumulates itself — k backwards in an
    inner loop, then one step; a step under ``if (i + 1) % k == 0`` — is not this."""
    loops_b, loops_s = script.enclosing_loops(backward), script.enclosing_loops(step)
    if [id(lp) for lp in loops_b] != [id(lp) for lp in loops_s]:
        return False
    loop = loops_s[0] if loops_s else None
    return _branches(script, step, loop) <= _branches(script, backward, loop)


def _sites(script: Script, node: ast.AST) -> list[ast.AST]:
    """``node``, and the calls of its function (one level up): where a helper's backward happens for its caller."""
    fn = script.function_of(node)
    return [node] + ([] if fn is script.tree else list(script.call_sites(fn)))


def _following_step(script: Script, site: ast.AST) -> ast.Call | None:
    """The optimizer step that follows a backward: the next one in its loop (then, round the loop, the first one
    before it there), else the next one after it in its function; none in the other branch of an ``if``."""
    fn = script.function_of(site)
    steps = sorted((c for c in script.calls if script.function_of(c) is fn and _stepped(c) is not None), key=position)
    after = [c for c in steps if position(c) > position(site)]
    loops = script.enclosing_loops(site)
    if loops:
        inner = [c for c in after if script.inside(c, loops[0])]
        around = [c for c in steps if position(c) < position(site) and script.inside(c, loops[0])]
        after = inner + around + [c for c in after if c not in inner]
    return next((c for c in after if not _exclusive(script, c, site)), None)


def rings_at(script: Script, expr: ast.AST) -> list[ast.Call]:
    """The ``Ring(...)`` calls ``expr`` holds where it is read: the last assignment of the name before it in the
    same function when there is one (a script that makes a second Ring under the same name), else every one."""
    key = script.scope_of(expr) if isinstance(expr, ast.Name) else None
    if key is not None:
        earlier = [v for stmt, v in script.assignments.get(key, []) if position(stmt) < position(expr)
                   and script.function_of(stmt) is script.function_of(expr)]
        if earlier and earlier[-1] is not None:
            return ring_origins(script, earlier[-1])
    return ring_origins(script, expr)


def backward_without_ring(script: Script) -> Iterator[tuple]:
    if not ring_calls(script):
        return
    windows = ring_windows(script)
    given = given_to_setup(script)
    if not windows or not given:
        return
    for backward in _plain_backwards(script):
        found = None
        for site in _sites(script, backward):
            step = _following_step(script, site)
            setup = _setup_of(script, _stepped(step), given) if step is not None else None
            if setup is None or _exclusive(script, setup, site):
                continue
            if script.inside(setup, script.function_of(site)) and position(setup) > position(site):
                continue  # the optimizer is the ring's only after this backward
            for ring in rings_at(script, setup.func.value):
                for kind, where, how in windows.get(id(ring), []):
                    if kind == "fp16" or _every_time(script, site, step):
                        found = found or (kind, where, how, step, setup)
        if found is None:
            continue
        kind, where, how, step, setup = found
        text = script.text(backward.func.value) + ".backward()"
        ring = dotted(setup.func.value) or "ring"
        if kind == "accumulate":
            message = (f"`{text}` in a script whose Ring accumulates gradients ({how}, line {where.lineno}): only "
                       f"{ring}.backward counts micro-batches and closes the window, so after this backward the "
                       f"optimizer that {ring}.setup wraps steps at every {script.text(step)} (line {step.lineno}) — "
                       "on every batch, not once per window: the global batch ringtrain computes and prints (and the "
                       "learning rate was chosen for) is not the one trained, and under DDP every micro-batch "
                       "all-reduces")
        elif isinstance(backward.func.value, ast.Call) and callee_name(backward.func.value) == "scale":
            message = (f"`{text}` in a script whose Ring trains in float16 ({how}, line {where.lineno}): the loss is "
                       f"scaled by the script's own GradScaler, which the script undoes ({script.text(step)}, line "
                       f"{step.lineno}) — and then the optimizer {ring}.setup wraps unscales the gradients a second "
                       "time, dividing them "
                       "by the Ring's GradScaler scale (65,536 at first), which never multiplied them: every update "
                       "is that much too small, silently")
        else:
            message = (f"`{text}` in a script whose Ring trains in float16 ({how}, line {where.lineno}): "
                       f"{ring}.backward multiplies the loss by the Ring's GradScaler scale; this backward does not, "
                       f"yet the optimizer {ring}.setup wraps unscales the gradients at {script.text(step)} "
                       f"(line {step.lineno}) — divides them by that scale, 65,536 at first —: every update is that "
                       "much too small, silently, and small float16 gradients underflow to zero")
        yield (backward, message,
               f"call {ring}.backward(loss) instead (no GradScaler of the script's own: the Ring has one): it "
               "divides the loss by the accumulation window, scales it for float16, skips DDP's all-reduce inside "
               "the window, and the optimizer then steps once per window")


def _strategy(script: Script, ring: ast.AST) -> tuple[str, ast.AST, str] | None:
    """("fsdp", where, how): the Ring's strategy is FSDP ("fsdp", rt.strategies.FSDP(...)); ("open", where,
    how): the file computes it (an environment variable, an argument, a choice between FSDP and another);
    None: another one, or the default ("auto" is DDP or one device, never FSDP)."""
    verdicts: list[tuple[str, ast.AST, str]] = []
    for call in rings_at(script, ring):
        strategy = keyword(call, "strategy", 0)
        if strategy is None:
            return None
        how = f"Ring({script.text(strategy)})" if call.args and call.args[0] is strategy \
            else f"Ring(strategy={script.text(strategy)})"
        for origin in script.origins(strategy):
            if isinstance(origin, ast.Constant):
                if str(origin.value).lower() == "fsdp":
                    verdicts.append(("fsdp", call, how))
                else:
                    verdicts.append(("other", call, how))
            elif isinstance(origin, ast.Call) and (script.names.path(origin.func) or "").startswith("ringtrain."):
                verdicts.append(("fsdp" if callee_name(origin) == "FSDP" else "other", call, how))
            else:
                verdicts.append(("open", call, how))
    kinds = {v[0] for v in verdicts}
    if kinds == {"fsdp"}:
        return verdicts[0]
    if kinds & {"fsdp", "open"}:
        _, where, how = next(v for v in verdicts if v[0] != "other")
        return "open", where, how
    return None


def _optimizers(script: Script, sharding: Sharding) -> Iterator[tuple[ast.Call, set]]:
    """Optimizers the script builds, with the modules whose parameters they hold: ``torch.optim.AdamW(
    model.parameters())``, ``model.configure_optimizers(...)``."""
    for call in script.calls:
        path = script.names.path(call.func) or ""
        if path.startswith(_OPTIMIZERS) and path.rsplit(".", 1)[-1][:1].isupper() \
                and "lr_scheduler" not in path and "swa_utils" not in path:
            yield call, sharding.owners(keyword(call, "params", 0))
        elif callee_name(call) in _BUILDS_OPTIMIZER and isinstance(call.func, ast.Attribute):
            yield call, sharding.modules(call.func.value)


def optimizer_not_given_to_setup(script: Script) -> Iterator[tuple]:
    setups = _setups(script)
    if not setups:
        return
    sharding = Sharding(script)
    given = given_to_setup(script)
    optimizers = list(_optimizers(script, sharding))
    for setup in setups:
        if (strategy := _strategy(script, setup.func.value)) is None:
            continue
        model = keyword(setup, "model", 0)
        modules = sharding.modules(model)
        if not modules:
            continue
        for opt, owners in optimizers:
            keys = sharding.stored_in(opt)
            if not keys or keys & set(given) or not related(owners, modules) or sharding.first(opt, setup) is None:
                continue
            if any(o is not opt and sharding.stored_in(o) & keys and sharding.first(setup, o)
                   for o, _ in optimizers):
                continue  # built again after setup, into the same name: on the parameters setup gave back
            stepped = [c for c in script.calls if (s := _stepped(c)) is not None and script.aliases(s) & keys]
            if not stepped:
                continue
            kind, where, how = strategy
            name = script.text(model)
            targets = _targets(script, opt)
            optimizer = (dotted(targets[0]) if targets else None) or "optimizer"
            if kind == "fsdp":
                message = (f"{dotted(setup.func.value)}.setup({name}) is not given the optimizer built on {name}'s "
                           f"parameters at line {opt.lineno} (stepped at line {stepped[0].lineno}): under FSDP "
                           f"({how}, line {where.lineno}) setup puts sharded parameters in their place and points "
                           "only the optimizer it is given at them — this one keeps the old tensors, which the model "
                           "no longer uses: their gradients stay None, optimizer.step() trains nothing, and the loss "
                           "stays at chance level, silently")
                lower = None
            else:
                message = (f"under FSDP — the strategy here is {how} (line {where.lineno}), which the file does not "
                           f"fix —: {dotted(setup.func.value)}.setup({name}) is not given the optimizer built on "
                           f"{name}'s parameters at line {opt.lineno} (stepped at line {stepped[0].lineno}); FSDP's "
                           "setup puts sharded parameters in their place and points only the optimizer it is given at "
                           "them, so this one would keep the old tensors, nobody's gradients, and train nothing, "
                           "silently (under DDP it trains, but outside the ring's accumulation windows and float16 "
                           "scaling)")
                lower = "warning"
            yield (setup, message,
                   f"hand the optimizer to setup: {name}, {optimizer} = {dotted(setup.func.value)}.setup({name}, "
                   f"{optimizer}); it follows the parameters setup replaces, and steps on the ring's windows",
                   lower)
            break


def _targets(script: Script, call: ast.Call) -> list[ast.expr]:
    parent = script.parent.get(call)
    return [t for t in parent.targets if isinstance(t, (ast.Name, ast.Attribute))] \
        if isinstance(parent, ast.Assign) else []


def _one_rank(script: Script, call: ast.Call) -> int:
    """The line of the rank check that keeps a ring call off the other ranks (lexically, through an early
    ``return``, ``@rank_zero_only``, or every call of its function); 0 when every rank may run it, or when the
    other branch of the check makes the same ring call."""
    sites = parting(script, call)
    if not sites:
        return 0
    name = callee_name(call)
    for _, _, other in sites:
        if any(callee_name(c) == name and isinstance(c.func, ast.Attribute) and is_ring(script, c.func.value)
               for stmt in other for c in script.calls_in(stmt, 1)):
            return 0
    return sites[0][1]


def ring_save_on_one_rank(script: Script) -> Iterator[tuple]:
    if not ring_calls(script):
        return
    for call in script.calls:
        name = callee_name(call)
        if name not in ("save", "load") or not isinstance(call.func, ast.Attribute) \
                or not is_ring(script, call.func.value):
            continue
        if not (line := _one_rank(script, call)):
            continue
        ring = dotted(call.func.value) or "ring"
        if name == "save":
            message = (f"{ring}.save runs only on the process(es) picked by the rank check at line {line}: "
                       f"{ring}.save is meant for every rank — rank 0 writes the checkpoint once, the others hand it "
                       "their part (their random state and loader positions; under FSDP their shards) and wait for "
                       "its word that the file is written —, so under the check rank 0 waits for ranks that never "
                       "come: the job hangs there (ringtrain's liveness check ends it, naming this call)")
        else:
            message = (f"{ring}.load runs only on the process(es) picked by the rank check at line {line}: "
                       f"{ring}.load is meant for every rank — each puts the checkpoint back into its own model, "
                       "optimizer and loop position (a sharded folder is read together) —, so under the check rank 0 "
                       "waits for ranks that never come, or resumes alone while the others start again at step 0 with "
                       "their own weights and, once its shorter run is over, wait in collectives nobody joins: a "
                       "hang either way")
        does = "it writes once, on rank 0, by itself" if name == "save" else \
            "each rank reads the checkpoint into its own model, optimizer and loop"
        yield (call, message,
               f"call {ring}.{name}(...) on every rank, outside the `if` ({does}); keep only the printing under the "
               "rank check")
