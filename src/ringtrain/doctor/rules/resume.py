"""What a ringtrain checkpoint cannot see in a script's own data loading: a batch prefetched across the step
boundary, and a loader of the script's own class that keeps its own position.

A Ring with ``checkpoint_dir`` saves at the top of a ``ring.steps`` iteration (or at ``ring.backward`` in a loop of
the script's own) and a restarted job resumes there, with each rank's random state put back; ``ring.save`` /
``ring.load`` do the same by hand. Two things of the script's fall outside that:

* the nanoGPT prefetch, ``X, Y = get_batch('train')`` before the loop and again right after each forward: the batch
  step N+1 trains was drawn during step N, before the checkpoint, so a resumed run's own draw before the loop gives
  another batch (``get_batch = ring.batches(get_batch)`` keeps a drawn, unused batch in the checkpoint and gives it
  back after the resume: src/ringtrain/loop/batches.py);
* a ``DataLoaderLite`` (build-nanogpt, llm.c): an object that walks its token shards with
  ``self.current_position`` — the checkpoint holds no such position unless the object is handed over with
  ``ring.keep(loader)`` (any object with state_dict()/load_state_dict(); its state rides in every checkpoint, per
  rank).

Both matter only when a run resumes, so both are warnings and say so; a script that never checkpoints through the
Ring is left alone.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ..nodes import callee_name, dotted, is_const, is_evalish, keyword, position
from ..script import Script, name_options
from .ring import is_ring, ring_calls
from .ring_use import rings_at

# Attributes that hold where a loader of the script's own is in its data.
_POSITION = re.compile(r"(^|_)(pos|position|idx|index|shard|offset|cursor|ptr|pointer)(_|$)|^(current|cur)_")
# Calls that draw a batch: get_batch('train'), train_loader.next_batch(), next(train_iter), sample_batch(...).
_DRAW = re.compile(r"batch|sample|fetch|^next$|^get_data$|^load_data$")
# Calls a batch may pass through that are not a forward of the model.
_NOT_A_FORWARD = {"print", "len", "str", "repr", "isinstance", "type", "id", "getattr", "hasattr", "format",
                  "info", "debug", "warning", "log"}


def resumes(script: Script, rings: list[ast.Call]) -> tuple[ast.AST, str] | None:
    """Where these Rings checkpoint: ``Ring(checkpoint_dir=...)``, or a ``ring.save``/``ring.load`` on one of them
    (the first, and how it reads); None: they never checkpoint, so nothing resumes."""
    ids = {id(r) for r in rings}
    for call in rings:
        folder = keyword(call, "checkpoint_dir")
        if folder is not None and not is_const(folder, None):
            return call, f"checkpoint_dir={script.text(folder)}"
    for call in script.calls:
        if callee_name(call) in ("save", "load") and isinstance(call.func, ast.Attribute) \
                and any(id(r) in ids for r in rings_at(script, call.func.value)):
            return call, f"{dotted(call.func) or 'ring.save'}(...)"
    return None


def rings_near(script: Script, node: ast.AST) -> list[ast.Call]:
    """The Rings a piece of the script works with: those its function builds or calls methods of (``ring.steps``,
    ``ring.backward``); every Ring of the file when it shows none."""
    fn = script.function_of(node)
    found: dict[int, ast.Call] = {}
    for call in script.calls:
        if script.function_of(call) is not fn:
            continue
        if script.names.concept(call) == "Ring":
            found[id(call)] = call
        elif isinstance(call.func, ast.Attribute):
            found.update((id(r), r) for r in rings_at(script, call.func.value) if is_ring(script, call.func.value))
    return list(found.values()) or ring_calls(script)


def _step_loops(script: Script) -> Iterator[tuple[ast.AST, list[ast.Call]]]:
    """``for step in ring.steps(n):`` (also ``ring.epochs``) with its Ring, and ``while`` loops whose Ring (the one
    they call, ring.backward) has a checkpoint folder: ring.backward is their safe point."""
    for loop in script.loops:
        if isinstance(loop, (ast.For, ast.AsyncFor)):
            rings = [r for c in ast.walk(loop.iter) if isinstance(c, ast.Call) and callee_name(c) in ("steps", "epochs")
                     and isinstance(c.func, ast.Attribute) and is_ring(script, c.func.value)
                     for r in rings_at(script, c.func.value)]
            if rings:
                yield loop, rings
        else:
            rings = [r for c in ast.walk(loop) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                     and is_ring(script, c.func.value) for r in rings_at(script, c.func.value)]
            rings = [r for r in rings if (f := keyword(r, "checkpoint_dir")) is not None and not is_const(f, None)]
            if rings:
                yield loop, rings


def _own(script: Script, node: ast.AST, container: ast.AST) -> bool:
    """Is ``node`` in ``container`` and in its function (not in a ``def`` inside it)?"""
    return script.inside(node, container) and script.function_of(node) is script.function_of(container)


def _draws(script: Script, fn: ast.AST) -> Iterator[tuple[ast.Assign, ast.Call, str, set[str]]]:
    """``X, Y = get_batch('train')``, ``x, y = loader.next_batch()`` in function ``fn``: the statement, the call,
    the callee's text and the names assigned."""
    for node in script.nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1 \
                and script.function_of(node) is fn and (callee := dotted(node.value.func)) is not None \
                and _DRAW.search(callee.split(".")[-1].lower()):
            target = node.targets[0]
            elts = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
            names = {e.id for e in elts if isinstance(e, ast.Name)}
            if names and len(names) == len(elts):
                yield node, node.value, callee, names


def _wrapped(script: Script, func: ast.AST) -> bool:
    """Is the draw ``ring.batches(...)``'s wrapper: ``get_batch = ring.batches(get_batch)``,
    ``next_batch = ring.batches(train_loader.next_batch)``?"""
    for origin in [func, *script.origins(func)]:
        if isinstance(origin, ast.Call) and callee_name(origin) == "batches" and isinstance(origin.func, ast.Attribute) \
                and is_ring(script, origin.func.value):
            return True
    return False


def _used_before(script: Script, loop: ast.AST, names: set[str], redraw: ast.Assign) -> ast.AST | None:
    """A forward's use, inside ``loop`` and before ``redraw``, of a name ``redraw`` assigns, with no assignment
    of that name in the loop before it: the batch this iteration trains was drawn by the previous one (or before
    the loop)."""
    stores = [n for n in ast.walk(loop) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id in names
              and _own(script, n, loop)]
    for node in ast.walk(loop):
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in names):
            continue
        if not _own(script, node, loop) or position(node) >= position(redraw) or script.inside(node, redraw):
            continue
        if any(position(s) < position(node) for s in stores):
            continue
        call = next((a for a in script.ancestors(node) if isinstance(a, ast.Call)), None)
        if call is not None and callee_name(call) not in _NOT_A_FORWARD and _own(script, call, loop):
            return call
    return None


def prefetched_batch(script: Script) -> Iterator[tuple]:
    if not ring_calls(script):
        return
    for loop, rings in _step_loops(script):
        if (saving := resumes(script, rings)) is None:
            continue
        fn = script.function_of(loop)
        draws = list(_draws(script, fn))
        before = [d for d in draws if position(d[0]) < position(loop) and not script.inside(d[0], loop)]
        inside = [d for d in draws if script.inside(d[0], loop)]
        for stmt, call, callee, names in inside:
            first = next((d for d in before if d[2] == callee and d[3] & names), None)
            if first is None or _wrapped(script, call.func):
                continue
            forward = _used_before(script, loop, names, stmt)
            if forward is None:
                continue
            where, how = saving
            batch = ", ".join(sorted(names & first[3], key=lambda n: script.text(stmt.targets[0]).find(n)))
            draw = script.text(call)
            yield (stmt,
                   f"when the run resumes from a checkpoint ({how}, line {where.lineno}), its first step trains "
                   f"another batch: `{batch}` is drawn before the loop (line {first[0].lineno}) and again here, after "
                   f"the forward that uses it (line {forward.lineno}), so the batch each step trains was drawn during "
                   "the step before — before that step's checkpoint. A resumed run draws its own first batch before "
                   "the loop instead (random indices from the restored state, or a loader's next position), and "
                   "from there on is not the run it continues",
                   f"wrap the draw once, before its first call: {callee} = ring.batches({callee}) (the calls stay "
                   f"as they are: {draw}); a batch drawn before a checkpoint and not yet trained rides in it, and the "
                   "resumed run gets it back instead of drawing")
            break


def _assigned_attrs(fn: ast.AST) -> Iterator[tuple[str, ast.AST, bool]]:
    """``self.<attr>`` assignments in a method: the attribute, the statement, and whether it advances (``+=``, or a
    value made from the attribute itself: ``(self.current_shard + 1) % n``)."""
    for node in ast.walk(fn):
        if isinstance(node, ast.AugAssign):
            targets, value, advances = [node.target], None, True
        elif isinstance(node, ast.Assign):
            targets, value, advances = node.targets, node.value, False
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                grows = advances or any(isinstance(n, ast.Attribute) and n.attr == target.attr
                                        and isinstance(n.value, ast.Name) and n.value.id == "self"
                                        for n in ast.walk(value))
                yield target.attr, node, grows


class _Walker:
    """A class of the script's own that hands out batches with ``next_batch`` and advances a position in it."""

    def __init__(self, cls: ast.ClassDef):
        self.cls = cls
        self.methods = {m.name: m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.advanced: list[tuple[str, ast.AST]] = []
        for method in self._reached(self.methods["next_batch"]):
            self.advanced += [(attr, stmt) for attr, stmt, grows in _assigned_attrs(method)
                              if grows and _POSITION.search(attr)]
        self.attrs = sorted({a for a, _ in self.advanced})
        # methods that set the position back (DataLoaderLite.reset): a loader reset before each use needs no keeping
        self.resets = {name for name, m in self.methods.items() if name not in ("__init__", "next_batch")
                       and any(attr in self.attrs and not grows for attr, _, grows in _assigned_attrs(m))}

    def _reached(self, method: ast.AST, depth: int = 2) -> list[ast.AST]:
        """``method`` and the methods of the class it calls on ``self`` (``self.advance()``)."""
        found, frontier = [method], [method]
        for _ in range(depth):
            frontier = [self.methods[c.func.attr] for m in frontier for c in ast.walk(m)
                        if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                        and isinstance(c.func.value, ast.Name) and c.func.value.id == "self"
                        and c.func.attr in self.methods and self.methods[c.func.attr] not in found]
            found += frontier
        return found


def _walkers(script: Script) -> list[_Walker]:
    found = []
    for node in script.nodes:
        if isinstance(node, ast.ClassDef) and any(isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                                                  and m.name == "next_batch" for m in node.body):
            walker = _Walker(node)
            if walker.advanced:
                found.append(walker)
    return found


def _names(script: Script, expr: ast.AST) -> set:
    """The bindings an expression may name: ``loader``, both of ``(train_loader if train else val_loader)``."""
    return {k for option in name_options(expr) for k in script.aliases(option)}


def _handed_over(script: Script, keys: set, construction: ast.Call) -> bool:
    """Does the ring (or the script) keep this loader's position: ``ring.keep(loader)`` (also around the
    construction), the loader given to ``ring.save``/``ring.load``, its ``load_state_dict`` called, its position
    set from outside (``loader.current_position = ckpt[...]``), or read into ``ring.extras``?"""
    for a in script.ancestors(construction):
        if isinstance(a, ast.Call) and callee_name(a) == "keep" and isinstance(a.func, ast.Attribute):
            return True
    for call in script.calls:
        name = callee_name(call)
        if not isinstance(call.func, ast.Attribute):
            continue
        if name in ("keep", "save", "load") and is_ring(script, call.func.value):
            for arg in (*call.args, *(k.value for k in call.keywords)):
                if any(isinstance(n, (ast.Name, ast.Attribute)) and script.aliases(n) & keys for n in ast.walk(arg)):
                    return True
        if name == "load_state_dict" and script.aliases(call.func.value) & keys:
            return True
    for node in script.nodes:
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and script.aliases(target.value) & keys:
                    return True  # the script sets the loader's state itself
        if isinstance(node, ast.Attribute) and node.attr == "extras" and is_ring(script, node.value):
            statement = next((a for a in script.ancestors(node) if isinstance(a, ast.stmt)), node)
            if any(isinstance(n, (ast.Name, ast.Attribute)) and script.aliases(n) & keys for n in ast.walk(statement)):
                return True
    return False


def _dominates(script: Script, first: ast.AST, second: ast.AST) -> bool:
    """Does ``first`` run before ``second`` every time ``second`` runs: written before it in the same loop (or
    function), under no ``if`` that ``second`` is not under too?"""
    if position(first) >= position(second) or script.function_of(first) is not script.function_of(second):
        return False
    loops = script.enclosing_loops(second)
    if loops and not script.inside(first, loops[0]):
        return False
    around = {(id(b), side) for b, side in script.branches_around(second)}
    return all((id(b), side) in around for b, side in script.branches_around(first))


def loader_position_not_kept(script: Script) -> Iterator[tuple]:
    if not ring_calls(script):
        return
    for walker in _walkers(script):
        cls = walker.cls
        for construction in (c for c in script.calls if isinstance(c.func, ast.Name) and c.func.id == cls.name):
            parent = script.parent.get(construction)
            if not isinstance(parent, ast.Assign):
                continue
            targets = [t for t in parent.targets if isinstance(t, (ast.Name, ast.Attribute))]
            keys = {k for t in targets if (k := script.scope_of(t)) is not None}
            name = dotted(targets[0]) if targets else None
            if not keys or name is None or is_evalish(name):
                continue  # an evaluation loader: read from its start each time
            uses = [n for n in script.nodes if isinstance(n, ast.Attribute) and n.attr == "next_batch"
                    and _names(script, n.value) & keys]
            if not uses or _handed_over(script, keys, construction):
                continue
            resets = [c for c in script.calls if isinstance(c.func, ast.Attribute) and c.func.attr in walker.resets
                      and _names(script, c.func.value) & keys]
            if all(any(_dominates(script, r, u) for r in resets) for u in uses):
                continue  # reset before every use (DataLoaderLite's val_loader.reset() before each evaluation)
            if (saving := resumes(script, rings_near(script, uses[0]))) is None:
                continue
            where, how = saving
            attr, stmt = walker.advanced[0]
            has_state = {"state_dict", "load_state_dict"} <= set(walker.methods)
            give = "" if has_state else (
                f"give {cls.name} a state_dict() returning its position ({', '.join('self.' + a for a in walker.attrs)}) "
                "and a load_state_dict(state) that sets it back (and reloads the shard it names), then ")
            yield (construction,
                   f"`{name}` ({cls.name}, line {cls.lineno}) walks its data with a position of its own — "
                   f"self.{attr} advances in {cls.name}.next_batch (line {stmt.lineno}) — that no checkpoint holds: "
                   f"it is never handed to the ring with ring.keep, so when the run resumes from a checkpoint ({how}, "
                   f"line {where.lineno}) {name} starts again from the beginning of its data: the resumed run trains "
                   "the batches it already trained on again, and the data after them comes later or never",
                   f"{give}hand it to the ring once, before the loop: ring.keep({name}); each rank's position then "
                   "rides in every checkpoint, and a resumed run continues where it stopped")
