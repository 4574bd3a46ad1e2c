"""Following a sharded model through the script: what fully_shard and FSDP1's wrapper shard, the
optimizers built on it, and what a state-dict call of it gives.

FSDP2's ``fully_shard(module)`` swaps the module's parameters for DTensor shards in place (each
rank holds 1/world of each one); FSDP1's ``FullyShardedDataParallel(module)`` wraps it and
flattens them into sharded FlatParameters. Either way the parameter objects change, and a state
dict is one rank's piece unless it is gathered, which is a collective every rank must join
(https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html; StateDictOptions in
torch.distributed.checkpoint.state_dict).

A module is followed through its names to the bindings it stands for (:meth:`Sharding.modules`);
two modules are the same model when one binding is the other or a submodule of it: sharding
``model.layers[i]`` shards part of ``model``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from ..nodes import callee_name, is_const, keyword, position
from ..script import Script
from .model import _exclusive

Key = tuple[ast.AST, str]  # a binding: (scope, dotted name)

# Calls that give back the module they are called on or with (or one sharing its parameters).
_SAME_MODULE = {"to", "cuda", "cpu", "train", "eval", "float", "half", "bfloat16", "to_empty", "requires_grad_",
                "modules", "children", "named_modules", "named_children", "values", "items"}
_ITERATING = {"enumerate", "list", "tuple", "reversed", "iter", "sorted", "zip"}
_OPTIMIZERS = ("torch.optim.", "torch.distributed.optim.", "bitsandbytes.optim.", "apex.optimizers.")
GETTERS = ("get_model_state_dict", "get_optimizer_state_dict", "get_state_dict")


@dataclass(frozen=True)
class Shard:
    call: ast.Call  # fully_shard(...) or FullyShardedDataParallel(...)
    keys: frozenset  # the bindings of the module it shards, and of the result
    fsdp1: bool


def related(a: set[Key], b: set[Key]) -> bool:
    """Is one of the modules the other, or inside it?"""
    return any(sa is sb and (ta == tb or ta.startswith(tb + ".") or tb.startswith(ta + "."))
               for sa, ta in a for sb, tb in b)


def is_state_call(script: Script, call: ast.Call) -> bool:
    """``x.state_dict()``, a torch.distributed.checkpoint getter, or FSDP1's optim_state_dict."""
    concept = script.names.concept(call) or ""
    return (callee_name(call) == "state_dict" and isinstance(call.func, ast.Attribute) and not call.args) \
        or concept in GETTERS or concept.startswith("FSDP.")


class Sharding:
    """What one script shards, read once; the rules ask it questions."""

    def __init__(self, script: Script):
        self.script = script
        self._modules: dict[int, set[Key]] = {}
        self.shards = sorted((Shard(call, frozenset(self.modules(_module_arg(call)) | self.stored_in(call)),
                                    concept == "FSDP")
                              for concept in ("fully_shard", "FSDP") for call in script.concept_calls.get(concept, [])),
                             key=lambda s: position(s.call))
        self.optimizers: list[tuple[ast.Call, set[Key]]] = []
        if self.shards:
            for call in script.calls:
                path = script.names.path(call.func) or ""
                if path.startswith(_OPTIMIZERS) and path.rsplit(".", 1)[-1][:1].isupper() \
                        and "lr_scheduler" not in path and "swa_utils" not in path:
                    self.optimizers.append((call, self.owners(keyword(call, "params", 0))))

    # --- which module ------------------------------------------------------------------

    def modules(self, expr: ast.AST | None) -> set[Key]:
        """The bindings a module expression stands for: ``model.layers`` and ``model`` for a loop
        name over ``model.layers``; through plain assignments, ``fully_shard(m)``/``m.to(d)`` (the
        same module), a helper's parameter (its arguments) and a local function's return value."""
        if expr is None:
            return set()
        if id(expr) not in self._modules:
            self._modules[id(expr)] = set()  # a cycle (model = FSDP(model)) stops here
            self._modules[id(expr)] = self._find_modules(expr)
        return self._modules[id(expr)]

    def _find_modules(self, expr: ast.AST) -> set[Key]:
        script = self.script
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant):
            # model[0] and model[1] are two modules, each inside model
            return {(scope, f"{text}.[{expr.slice.value!r}]") for scope, text in self.modules(expr.value)}
        if isinstance(expr, (ast.Subscript, ast.Starred)):
            return self.modules(expr.value)
        if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            return {k for e in expr.elts for k in self.modules(e)}
        if isinstance(expr, ast.Call):
            if script.names.concept(expr) in ("fully_shard", "FSDP") or script.names.path(expr.func) == "torch.compile":
                return self.modules(_module_arg(expr))
            if isinstance(expr.func, ast.Attribute) and expr.func.attr in _SAME_MODULE:
                return self.modules(expr.func.value)
            if isinstance(expr.func, ast.Name) and expr.func.id in _ITERATING:
                return {k for a in expr.args for k in self.modules(a)}
            return {k for r in script.returned(expr) for k in self.modules(r)}
        key = script.scope_of(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else None
        if key is None or key[1] in ("self", "cls"):
            return set()
        found = {key}
        if isinstance(expr, ast.Attribute):
            found |= {(scope, f"{text}.{expr.attr}") for scope, text in self.modules(expr.value)}
        loop = self._loop_binding(expr)
        if loop is not None:  # inside `for layer in model.layers:`, layer is one of those, whatever else it names
            return found | self.modules(loop.iter)
        for stmt, value in script.assignments.get(key, []):
            if value is None and isinstance(stmt, (ast.For, ast.AsyncFor)):
                found |= self.modules(stmt.iter)  # `for layer in model.layers:`
            elif value is not None:
                found |= self.modules(value)
        for argument in script.arguments(expr):
            found |= self.modules(argument)
        return found

    def _loop_binding(self, expr: ast.AST) -> ast.For | ast.AsyncFor | None:
        """The ``for`` around ``expr`` (in its function) whose target binds it, if any."""
        if not isinstance(expr, ast.Name):
            return None
        for loop in self.script.enclosing_loops(expr):
            if isinstance(loop, (ast.For, ast.AsyncFor)) \
                    and any(isinstance(n, ast.Name) and n.id == expr.id for n in ast.walk(loop.target)):
                return loop
        return None

    def stored_in(self, value: ast.AST, depth: int = 2) -> set[Key]:
        """The bindings a value is stored in: ``net`` in ``net = FSDP(Net())``, also when a helper
        returns it (``net = wrap(Net())``)."""
        script = self.script
        parent = script.parent.get(value)
        if isinstance(parent, ast.Assign):
            return {k for t in parent.targets if (k := script.scope_of(t)) is not None}
        fn = script.function_of(value)
        if isinstance(parent, ast.Return) and fn is not script.tree and depth:
            return {k for c in script.call_sites(fn) for k in self.stored_in(c, depth - 1)}
        return set()

    def owners(self, expr: ast.AST | None) -> set[Key]:
        """The modules whose ``.parameters()`` an optimizer's ``params`` hold (see :meth:`_owners`)."""
        return self._owners(expr, set())

    def _owners(self, expr: ast.AST | None, seen: set[int]) -> set[Key]:
        """The modules whose ``.parameters()`` an optimizer's ``params`` hold (through names,
        parameter groups, ``filter(...)``, a helper's parameter)."""
        found: set[Key] = set()
        if expr is None or id(expr) in seen:
            return found
        seen.add(id(expr))
        for node in ast.walk(expr):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("parameters", "named_parameters"):
                found |= self.modules(node.func.value)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                for value in self.script.values(node) + self.script.arguments(node):
                    found |= self._owners(value, seen)
        return found

    def shard_of(self, keys: set[Key]) -> Shard | None:
        return next((s for s in self.shards if related(keys, s.keys)), None)

    # --- order -------------------------------------------------------------------------

    def _sites(self, node: ast.AST, depth: int = 2) -> list[ast.AST]:
        """``node`` and the calls of this file that lead to it, through ``depth`` functions."""
        script = self.script
        found, frontier = [node], [node]
        for _ in range(depth):
            frontier = [c for n in frontier if script.function_of(n) is not script.tree
                        for c in script.call_sites(script.function_of(n))]
            found += frontier
        return found

    def first(self, a: ast.AST, b: ast.AST) -> ast.AST | None:
        """Where ``a`` runs before ``b``: ``a`` (or a call leading to it) written before ``b`` (or a
        call leading to it) in one function, not in the other branch of an ``if``."""
        script = self.script
        for sa in self._sites(a):
            for sb in self._sites(b):
                if script.function_of(sa) is script.function_of(sb) and position(sa) < position(sb) \
                        and not script.inside(sb, sa) and not _exclusive(script, sa, sb):
                    return sa
        return None

    # --- state dicts -------------------------------------------------------------------

    def owner(self, call: ast.Call) -> str | None:
        """Whose state a state-dict call reads: "fsdp1" or "fsdp2" (a sharded model, or a part of
        one), "optimizer" (one built on a sharded model's parameters), None (nothing sharded)."""
        if callee_name(call) == "state_dict" and isinstance(call.func, ast.Attribute):
            target = call.func.value
        else:
            target = call.args[0] if call.args else keyword(call, "model")
        shard = self.shard_of(self.modules(target))
        if shard is not None:
            return "fsdp1" if shard.fsdp1 else "fsdp2"
        built = {id(o) for o in self.script.built_from(target) if o is not None}
        if any(id(opt) in built and self.shard_of(owners) for opt, owners in self.optimizers):
            return "optimizer"
        return None

    def state(self, call: ast.Call) -> tuple[str, bool] | None:
        """What a state-dict call gives, and whether it is a collective: ("full", True) the same
        gathered state on every rank; ("rank0", True) gathered on rank 0, an empty dict on the
        others; ("shards", ...) each rank's own piece. None: not the state of a sharded model."""
        script = self.script
        if not self.shards or not is_state_call(script, call) or (owner := self.owner(call)) is None:
            return None
        concept = script.names.concept(call) or ""
        statement = next((a for a in script.ancestors(call) if isinstance(a, ast.stmt)), call)
        if concept.startswith("FSDP.") or any(isinstance(n, ast.Call) and callee_name(n) == "full_tensor"
                                              for n in ast.walk(statement)):
            return "full", True  # {k: v.full_tensor() for k, v in model.state_dict().items()} gathers too
        if concept in GETTERS:
            flags = {kw.arg for o in script.origins(keyword(call, "options")) if isinstance(o, ast.Call)
                     and script.names.concept(o) == "StateDictOptions" for kw in o.keywords if is_const(kw.value, True)}
            if "full_state_dict" in flags:
                return ("rank0" if "cpu_offload" in flags else "full"), True
            return "shards", False
        if owner == "fsdp1":
            said = self._fsdp1_type(call)
            if "LOCAL_STATE_DICT" in said or "SHARDED_STATE_DICT" in said:
                return "shards", "SHARDED_STATE_DICT" in said
            return ("rank0" if "rank0_only" in said else "full"), True  # FULL_STATE_DICT, FSDP1's default
        return "shards", False

    def _fsdp1_type(self, call: ast.Call) -> set[str]:
        """The state-dict type in force for an FSDP1 state_dict(): the attribute names and True flags
        given to a ``with FSDP.state_dict_type(...)`` around it, or to set_state_dict_type anywhere."""
        script = self.script
        setters = [i.context_expr for a in script.ancestors(call) if isinstance(a, (ast.With, ast.AsyncWith))
                   for i in a.items] + [c for c in script.calls if callee_name(c) == "set_state_dict_type"]
        said = set()
        for setter in setters:
            if not (isinstance(setter, ast.Call) and callee_name(setter) in ("state_dict_type", "set_state_dict_type")):
                continue
            for arg in (*setter.args, *(k.value for k in setter.keywords)):
                for node in (n for o in script.origins(arg) if o is not None for n in ast.walk(o)):
                    if isinstance(node, ast.Attribute):
                        said.add(node.attr)
                    elif isinstance(node, ast.keyword) and is_const(node.value, True):
                        said.add(node.arg)
        return said

    def saved_states(self, expr: ast.AST | None, seen: set[int] | None = None) -> Iterator[ast.Call]:
        """The state-dict calls whose result a saved object may hold: in it, or through names, items
        stored into a dict, a helper's parameter and a local function's return value."""
        seen = set() if seen is None else seen
        if expr is None or id(expr) in seen:
            return
        seen.add(id(expr))
        script = self.script
        for node in ast.walk(expr):
            if isinstance(node, ast.Call):
                if is_state_call(script, node):
                    yield node
                else:
                    for value in script.returned(node):
                        yield from self.saved_states(value, seen)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                stored = script.stored_items.get(script.scope_of(node), [])
                for value in script.values(node) + script.arguments(node) + stored:
                    yield from self.saved_states(value, seen)

    def writes(self, save: ast.Call) -> str | None:
        """What a torch.save writes that differs per rank: "shards" (each rank its own piece) or
        "rank0" (the gathered state on rank 0, an empty dict on the others); None: nothing such."""
        if not self.shards:
            return None
        kinds = {k[0] for c in self.saved_states(keyword(save, "obj", 0)) if (k := self.state(c))}
        return "shards" if "shards" in kinds else "rank0" if "rank0" in kinds else None


def _module_arg(call: ast.Call) -> ast.expr | None:
    return call.args[0] if call.args else keyword(call, "module") or keyword(call, "model")
