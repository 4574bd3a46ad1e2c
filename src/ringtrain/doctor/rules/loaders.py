"""Following a DataLoader through the script: its sampler, the names it is bound to, the
loops that iterate it (directly, through ``enumerate``/``tqdm``, through a loop name or a
function parameter) and the epoch loop around those."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..nodes import dotted, keyword
from ..script import Script

# DataLoader(dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, ...)
# DistributedSampler(dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False)


@dataclass
class Loader:
    call: ast.Call
    sampler: ast.expr | None
    samplers: list[ast.Call]  # the DistributedSampler constructions its sampler may be
    bindings: list[ast.expr] = field(default_factory=list)  # names the loader is stored in

    @property
    def dataset(self) -> ast.expr | None:
        return keyword(self.call, "dataset", 0)

    def names(self) -> list[str]:
        """Texts that say what the loader is for: its names, its dataset's, its sampler's."""
        texts = [dotted(b) for b in self.bindings]
        texts += [dotted(self.dataset), dotted(self.sampler)]
        for s in self.samplers:
            texts.append(dotted(keyword(s, "dataset", 0)))  # the first argument in torch and MONAI
        return [t for t in texts if t]


# Positions of DistributedSampler's arguments: torch's (dataset, num_replicas, rank, shuffle,
# seed, drop_last); MONAI's subclass puts even_divisible second, so its positions are not used.
_SAMPLER_POSITIONS = {"dataset": 0, "shuffle": 3, "seed": 4, "drop_last": 5}


def sampler_arg(script: Script, sampler: ast.Call, name: str) -> ast.expr | None:
    """An argument of a DistributedSampler construction, by keyword or torch's position."""
    path = script.names.path(sampler.func) or ""
    position = _SAMPLER_POSITIONS.get(name) if not path.startswith("monai.") or name == "dataset" else None
    return keyword(sampler, name, position)


def sampler_calls(script: Script, expr: ast.expr | None) -> list[ast.Call]:
    return [o for o in script.origins(expr)
            if isinstance(o, ast.Call) and script.names.concept(o) == "DistributedSampler"]


def loaders(script: Script) -> Iterator[Loader]:
    for call in script.concept_calls.get("DataLoader", []):
        sampler = keyword(call, "sampler", 3)
        yield Loader(call, sampler, sampler_calls(script, sampler), bindings(script, call))


def bindings(script: Script, value: ast.AST, depth: int = 3) -> list[ast.expr]:
    """Where a value is stored: ``x = value``, or ``x = f(...)`` when ``f`` returns it
    (``depth`` levels of returns: mutual recursion ends there)."""
    parent = script.parent.get(value)
    if isinstance(parent, (ast.Assign, ast.AnnAssign)):
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        return [t for t in targets if isinstance(t, (ast.Name, ast.Attribute))]
    if isinstance(parent, ast.Return):
        found = []
        for caller in script.callers(script.function_of(parent)) if depth else []:
            found += bindings(script, caller, depth - 1)
        return found
    if isinstance(parent, ast.keyword):
        parent = script.parent.get(parent)
    if isinstance(parent, ast.Call) and value is not parent.func:
        # `Trainer(model, prepare_dataloader(...))`: the parameter that receives it
        found = []
        for fn in script.callees(parent):
            found += _params_receiving(script, parent, fn, value)
        return found
    return []


def _refers_to(script: Script, expr: ast.AST, keys: set) -> bool:
    return bool(script.aliases(expr) & keys)


def iteration_loops(script: Script, names: list[ast.expr], depth: int = 2) -> list[ast.AST]:
    """``for`` loops that iterate the object stored in ``names``, also as an argument of a
    function of this file that iterates its parameter."""
    keys = {script.scope_of(n) for n in names} - {None}
    found: list[ast.AST] = []
    for key in keys:
        found += [loop for loop in script.loops_over.get(key, []) if loop not in found]
    if depth:
        for key in keys:
            for call, _ in script.passed_to.get(key, []):
                for fn in script.callees(call):
                    for param in _params_receiving(script, call, fn, keys):
                        found += [loop for loop in iteration_loops(script, [param], depth - 1) if loop not in found]
    return found


def _params_receiving(script: Script, call: ast.Call, fn: ast.AST, what: set | ast.AST) -> Iterator[ast.Name]:
    """Uses, inside ``fn``, of the parameters that receive ``what`` from ``call``: an argument
    node, or any argument bound to one of the keys ``what``."""
    def matches(arg: ast.AST) -> bool:
        if isinstance(what, set):
            return isinstance(arg, (ast.Name, ast.Attribute)) and _refers_to(script, arg, what)
        return arg is what

    params = fn.args.posonlyargs + fn.args.args
    offset = 1 if (isinstance(call.func, ast.Attribute) or fn.name == "__init__") and params \
        and params[0].arg in ("self", "cls") else 0
    for i, arg in enumerate(call.args):
        if matches(arg) and i + offset < len(params):
            yield from _uses_of(fn, params[i + offset].arg)
    for kw in call.keywords:
        if kw.arg and matches(kw.value) and kw.arg in {p.arg for p in params + fn.args.kwonlyargs}:
            yield from _uses_of(fn, kw.arg)


def _uses_of(fn: ast.AST, name: str) -> Iterator[ast.Name]:
    """One use of parameter ``name`` inside ``fn`` (it stands for the binding in scope
    lookups); nothing when the function never uses it."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id == name:
            yield node
            return


def epoch_loops(script: Script, loop: ast.AST, keys: set | None = None, depth: int = 2) -> list[ast.AST]:
    """The loops that run ``loop`` again and again: the innermost loop around it, or around
    the calls of its function (``for epoch ...: train_one_epoch()``). A loop over the loaders
    themselves (``for phase, loader in [("train", train_loader), ...]``) is not an epoch loop."""
    around = [a for a in script.enclosing_loops(loop)
              if not (keys and isinstance(a, (ast.For, ast.AsyncFor)) and any(
                  _refers_to(script, n, keys) for n in ast.walk(a.iter) if isinstance(n, (ast.Name, ast.Attribute))))]
    if around:
        return [around[0]]
    fn = script.function_of(loop)
    if fn is script.tree or not depth:
        return []
    found = []
    for caller in script.callers(fn):
        found += epoch_loops(script, caller, None, depth - 1)
    return found
