"""The parsed script the rules read: parents, scopes, assignments, calls and who calls whom.

Everything here is built once per file in a few linear walks over the tree (the whole
check of a 1,000-line script must stay well under a second). The model is deliberately
simple — flow-insensitive assignments per scope, calls matched to ``def``s by name —
because rules only report what it can justify, and skip what it cannot see.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from collections.abc import Callable, Iterator

from .names import CONCEPT_OF, Names
from .nodes import callee_name, dotted, identifiers, iterated, keyword, position
from .ranks import decorator_guards

FUNCTION = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
LOOP = (ast.For, ast.AsyncFor, ast.While)


class Script:
    """One parsed file and the indexes the rules share."""

    def __init__(self, path: str, source: str, tree: ast.Module):
        self.path = path
        self.source = source
        self.tree = tree
        self.parent: dict[ast.AST, ast.AST] = {}
        self.calls: list[ast.Call] = []
        self.defs: dict[str, list[ast.AST]] = defaultdict(list)  # function or class name -> defs
        self._callers: dict[str, list[ast.Call]] = defaultdict(list)
        self.concept_calls: dict[str, list[ast.Call]] = defaultdict(list)
        self.loops: list[ast.AST] = []  # every for/while, in walk order
        self.nodes: list[ast.AST] = list(ast.walk(tree))  # rules scan this list, not the tree again
        self._scopes: dict[ast.AST, tuple[ast.AST, str] | None] = {}
        self._aliases: dict[tuple[ast.AST, int], set] = {}
        self.names = Names(tree, self.nodes)
        for node in self.nodes:
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
            if isinstance(node, ast.Call):
                self.calls.append(node)
                name = callee_name(node)
                path = self.names.path(node.func)
                if name and path is None:  # `torch.save(...)` never runs this file's `def save`
                    self._callers[name].append(node)
                concept = CONCEPT_OF.get(path) if path else None
                if concept:
                    self.concept_calls[concept].append(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs[node.name].append(node)
            elif isinstance(node, LOOP):
                self.loops.append(node)
        self.calls.sort(key=position)
        self._locals = {fn: _bound_names(fn) for fn in self.nodes if isinstance(fn, FUNCTION)}
        self.assignments: dict[tuple[ast.AST, str], list[tuple[ast.AST, ast.expr | None]]] = defaultdict(list)
        self._index_assignments()

    def text(self, node: ast.AST) -> str:
        """The source of ``node`` as written (``3e-4``, not ``0.0003``), on one line."""
        segment = ast.get_source_segment(self.source, node) or ast.unparse(node)
        return " ".join(segment.split())

    # --- structure -------------------------------------------------------------------

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        while node in self.parent:
            node = self.parent[node]
            yield node

    def function_of(self, node: ast.AST) -> ast.AST:
        """The innermost function (or lambda) around a node, or the module."""
        for a in self.ancestors(node):
            if isinstance(a, FUNCTION):
                return a
        return self.tree

    def inside(self, node: ast.AST, container: ast.AST) -> bool:
        return node is container or any(a is container for a in self.ancestors(node))

    def enclosing_loops(self, node: ast.AST) -> list[ast.AST]:
        """Loops around ``node`` within its own function, innermost first (a loop's
        ``iter`` does not count as inside it)."""
        loops = []
        child = node
        for a in self.ancestors(node):
            if isinstance(a, FUNCTION) or isinstance(a, ast.ClassDef):
                break
            if isinstance(a, LOOP) and not (isinstance(a, (ast.For, ast.AsyncFor)) and (child is a.iter or child is a.target)):
                loops.append(a)
            child = a
        return loops

    def branches_around(self, node: ast.AST) -> Iterator[tuple[ast.If | ast.IfExp, bool]]:
        """Each ``if`` around ``node`` in its function, with True when node is in its body
        (False: in its ``else``); a node in the test itself is not guarded by it."""
        child = node
        for a in self.ancestors(node):
            if isinstance(a, FUNCTION):
                return
            if isinstance(a, (ast.If, ast.IfExp)) and child is not a.test:
                body = a.body if isinstance(a.body, list) else [a.body]
                yield a, any(child is s for s in body)
            child = a

    def callers(self, fn: ast.AST) -> list[ast.Call]:
        """Calls in this file that may reach ``fn`` (matched by name: ``f(...)``, ``x.f(...)``)."""
        if isinstance(fn, ast.Lambda) or fn is self.tree:
            return []
        return [c for c in self._callers.get(fn.name, []) if not self.inside(c, fn)]

    @functools.cached_property
    def loops_over(self) -> dict[tuple[ast.AST, str], list[ast.AST]]:
        """Binding -> the ``for`` loops that iterate it (``for x in loader``, ``enumerate(tqdm(loader))``,
        through aliases and loop names)."""
        index: dict[tuple[ast.AST, str], list[ast.AST]] = defaultdict(list)
        for loop in self.loops:
            if isinstance(loop, (ast.For, ast.AsyncFor)):
                for name in iterated(loop.iter):
                    for key in self.aliases(name):
                        index[key].append(loop)
        return index

    @functools.cached_property
    def passed_to(self) -> dict[tuple[ast.AST, str], list[tuple[ast.Call, ast.expr]]]:
        """Binding -> the calls that pass it as an argument, with the argument."""
        index: dict[tuple[ast.AST, str], list[tuple[ast.Call, ast.expr]]] = defaultdict(list)
        for call in self.calls:
            for arg in (*call.args, *(k.value for k in call.keywords)):
                if isinstance(arg, (ast.Name, ast.Attribute)):
                    for key in self.aliases(arg):
                        index[key].append((call, arg))
        return index

    def call_sites(self, fn: ast.AST) -> list[ast.Call]:
        """Like :meth:`callers`, and a class's ``__init__`` is reached by calling the class."""
        cls = self.parent.get(fn)
        if isinstance(fn, ast.FunctionDef) and fn.name == "__init__" and isinstance(cls, ast.ClassDef):
            return [c for c in self._callers.get(cls.name, []) if not self.inside(c, cls)]
        return self.callers(fn)

    def arguments(self, expr: ast.AST) -> list[ast.expr]:
        """What a function parameter receives: the matching argument at each call of its function
        in this file (``state`` in ``def save(state, path)`` called as ``save({...}, p)``); empty for
        anything but a parameter that the function never reassigns."""
        key = self.scope_of(expr) if isinstance(expr, ast.Name) else None
        fn = key[0] if key else None
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or self.assignments.get(key):
            return []
        positional = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if expr.id not in positional and expr.id not in {a.arg for a in fn.args.kwonlyargs}:
            return []
        method = isinstance(self.parent.get(fn), ast.ClassDef)
        bound = 1 if method and positional and positional[0] in ("self", "cls") else 0
        index = positional.index(expr.id) - bound if expr.id in positional[bound:] else None
        found = []
        for call in self.call_sites(fn):
            value = keyword(call, expr.id, index)
            if value is not None:
                found.append(value)
        return found

    def returned(self, call: ast.Call) -> list[ast.expr]:
        """What a call of a function of this file may return: its ``return`` expressions."""
        return [value for fn in self.callees(call) for value in self._returns.get(fn, ())]

    @functools.cached_property
    def _returns(self) -> dict[ast.AST, list[ast.expr]]:
        index: dict[ast.AST, list[ast.expr]] = defaultdict(list)
        for node in self.nodes:
            if isinstance(node, ast.Return) and node.value is not None:
                index[self.function_of(node)].append(node.value)
        return index

    @functools.cached_property
    def stored_items(self) -> dict[tuple[ast.AST, str], list[ast.expr]]:
        """Binding -> the values stored into it by subscript (``ckpt["model"] = model.state_dict()``)."""
        index: dict[tuple[ast.AST, str], list[ast.expr]] = defaultdict(list)
        for node in self.nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    key = self.scope_of(target.value) if isinstance(target, ast.Subscript) else None
                    if key is not None:
                        index[key].append(node.value)
        return index

    def callees(self, call: ast.Call) -> list[ast.AST]:
        """The ``def``s of this file a call may run (matched by name; a class's ``__init__``)."""
        found = []
        for d in self.defs.get(callee_name(call) or "", ()):
            if isinstance(d, ast.ClassDef):
                found += [m for m in d.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                          and m.name == "__init__"]
            else:
                found.append(d)
        return found

    def calls_in(self, node: ast.AST, depth: int = 2) -> Iterator[ast.Call]:
        """Calls inside ``node``, and inside the functions of this file it calls (``depth`` levels)."""
        seen: set[int] = set()
        frontier = [node]
        for level in range(depth + 1):
            nxt = []
            for n in frontier:
                if id(n) in seen:
                    continue
                seen.add(id(n))
                for sub in ast.walk(n):
                    if isinstance(sub, ast.Call):
                        yield sub
                        if level < depth:
                            nxt.extend(self.callees(sub))
            frontier = nxt

    def guarded(self, node: ast.AST, test: Callable[[ast.AST], bool], depth: int = 3) -> bool | None:
        """Is ``node`` reached only when ``test`` holds on some ``if`` on the way to it?

        True: every path this file shows is guarded (lexically, by an early ``return``
        under such a test, or because every call of its function is guarded). False:
        some path is not. None: its function is never called in this file.
        """
        for branch, _ in self.branches_around(node):
            if test(branch.test):
                return True
        if self._returns_early(node, test):
            return True
        fn = self.function_of(node)
        if fn is self.tree:
            return False
        if any(decorator_guards(d) for d in getattr(fn, "decorator_list", [])):
            return True
        if depth == 0:
            return None
        callers = self.callers(fn)
        if not callers:
            return None
        results = [self.guarded(c, test, depth - 1) for c in callers]
        if any(r is False for r in results):
            return False
        return True if any(r for r in results) else None

    def _returns_early(self, node: ast.AST, test: Callable[[ast.AST], bool]) -> bool:
        """``if rank != 0: return`` before ``node`` in one of the blocks around it."""
        child = node
        for a in self.ancestors(node):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(a, field, None)
                if isinstance(block, list) and any(child is s for s in block):
                    for stmt in block[:[id(s) for s in block].index(id(child))]:
                        if isinstance(stmt, ast.If) and test(stmt.test) and stmt.body and _leaves(stmt.body[-1]):
                            return True
            if isinstance(a, FUNCTION):
                return False
            child = a
        return False

    # --- values ----------------------------------------------------------------------

    def scope_of(self, expr: ast.AST) -> tuple[ast.AST, str] | None:
        """The binding a name or attribute chain refers to: (scope node, dotted text).

        ``self.x`` belongs to its class; other chains to the scope of their first name,
        which is the innermost function binding it (closures included) or the module.
        """
        if expr not in self._scopes:
            self._scopes[expr] = self._scope_of(expr)
        return self._scopes[expr]

    def _scope_of(self, expr: ast.AST) -> tuple[ast.AST, str] | None:
        text = dotted(expr)
        if text is None:
            return None
        root = text.split(".")[0]
        if root == "self":
            for a in self.ancestors(expr):
                if isinstance(a, ast.ClassDef):
                    return a, text
            return self.tree, text
        for a in self.ancestors(expr):
            if isinstance(a, FUNCTION) and root in self._locals[a]:
                return a, text
        return self.tree, text

    def values(self, expr: ast.AST) -> list[ast.expr | None]:
        """What a name may hold: the right-hand sides assigned to it anywhere in its scope
        (flow-insensitive; None for a binding with no visible value, like a loop name)."""
        key = self.scope_of(expr)
        if key is None:
            return []
        return [v for _, v in self.assignments.get(key, [])]

    def origins(self, expr: ast.AST | None, depth: int = 6) -> list[ast.expr | None]:
        """The expressions ``expr`` may come from, through names, ``x if c else y`` and ``a or b``."""
        if expr is None or depth == 0:
            return [expr]
        if isinstance(expr, ast.IfExp):
            return self.origins(expr.body, depth - 1) + self.origins(expr.orelse, depth - 1)
        if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or):
            return [o for v in expr.values for o in self.origins(v, depth - 1)]
        if isinstance(expr, ast.NamedExpr):
            return self.origins(expr.value, depth - 1)
        if isinstance(expr, (ast.Name, ast.Attribute)):
            vals = self.values(expr)
            if vals:
                return [o for v in vals for o in self.origins(v, depth - 1)]
        return [expr]

    def built_from(self, expr: ast.AST) -> list[ast.expr | None]:
        """``expr``, what it may come from, and what the names inside it may hold, through
        assignments and a helper's arguments: all a path like ``os.path.join(folder, name)`` is made of."""
        found = [expr, *self.origins(expr)]
        for node in ast.walk(expr):
            if isinstance(node, ast.Name):
                found += self.origins(node)
                for argument in self.arguments(node):
                    found += [argument, *self.origins(argument)]
        return found

    def aliases(self, expr: ast.AST, depth: int = 6) -> set[tuple[ast.AST, str]]:
        """The bindings ``expr`` names, directly or through plain ``a = b`` assignments and
        loop names (``for loader in (train_loader, val_loader)``)."""
        memo = (expr, depth)
        if memo in self._aliases:
            return self._aliases[memo]
        key = self.scope_of(expr)
        if key is None:
            return set()
        found = {key}
        self._aliases[memo] = found  # a cycle (a = b; b = a) stops here
        if depth:
            for value in self.values(expr):
                for option in name_options(value):
                    found |= self.aliases(option, depth - 1)
        return found

    def same_value(self, a: ast.AST, b: ast.AST) -> bool:
        """Do two names (possibly) refer to the same object, through plain assignments?"""
        ka, kb = self.aliases(a), self.aliases(b)
        if not ka or not kb:
            return True  # unknown: assume the same, never report on it
        return bool(ka & kb) or any(v is None for v in self.values(a) + self.values(b))

    def _bind(self, target: ast.AST, value: ast.expr | None, stmt: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            pairs = value.elts if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts) else None
            for i, t in enumerate(target.elts):
                self._bind(t, pairs[i] if pairs else None, stmt)
        elif isinstance(target, ast.Starred):
            self._bind(target.value, None, stmt)
        else:
            key = self.scope_of(target)
            if key is not None:
                self.assignments[key].append((stmt, value))

    def _index_assignments(self) -> None:
        for node in self.nodes:
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    self._bind(t, node.value, node)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                self._bind(node.target, node.value, node)
            elif isinstance(node, ast.AugAssign):
                self._bind(node.target, None, node)
            elif isinstance(node, ast.NamedExpr):
                self._bind(node.target, node.value, node)
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                # `for loader in (train_loader, val_loader)` and `for phase, loader in [("train",
                # train_loader), ...]`: the loop names are bound to each element in turn.
                if isinstance(node.iter, (ast.Tuple, ast.List)) and node.iter.elts:
                    for element in node.iter.elts:
                        self._bind(node.target, element, node)
                else:
                    self._bind(node.target, None, node)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        self._bind(item.optional_vars, None, node)
        for entries in self.assignments.values():
            entries.sort(key=lambda e: position(e[0]))

    # --- facts about the whole script ------------------------------------------------

    def has_concept(self, *concepts: str) -> bool:
        return any(self.concept_calls.get(c) for c in concepts)

    def is_distributed(self) -> bool:
        """Does the script run as several processes (torch.distributed, DDP, FSDP, Horovod, spawn)?"""
        if self.has_concept("init_process_group", "DDP", "DistributedSampler", "spawn", "hvd.init",
                            "hvd.DistributedOptimizer", "fully_shard", "FSDP"):
            return True
        return any(self.names.is_horovod(c.func) for c in self.calls)

    def divides_batch_by_workers(self) -> bool:
        """``batch_size = int(args.batch_size / ngpus_per_node)``: the script keeps a global
        batch fixed by dividing it among the processes or GPUs."""
        for node in self.nodes:
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv)) \
                    and any("batch" in n.lower() for n in identifiers(node.left)) \
                    and any(re.search(r"gpu|device_count|world|size|nproc|replica|worker", n.lower())
                            for n in identifiers(node.right)):
                return True
        return False

    def uses_cuda(self) -> bool:
        """Does anything in the script put work on a CUDA device?"""
        return self._uses_cuda

    @functools.cached_property
    def _uses_cuda(self) -> bool:
        for node in self.nodes:
            if isinstance(node, ast.Attribute) and node.attr == "cuda":
                return True
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("cuda"):
                return True
            if isinstance(node, ast.keyword) and node.arg in ("device_ids", "output_device"):
                return True
            if isinstance(node, ast.JoinedStr) and any(
                    isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value.startswith("cuda")
                    for v in node.values[:1]):
                return True
        return False


def name_options(value: ast.AST | None) -> list[ast.expr]:
    """The names a value may be: ``b`` in ``a = b``, both in ``a = b if c else d``."""
    if isinstance(value, (ast.Name, ast.Attribute)):
        return [value]
    if isinstance(value, ast.IfExp):
        return name_options(value.body) + name_options(value.orelse)
    if isinstance(value, ast.BoolOp):
        return [o for v in value.values for o in name_options(v)]
    return []


def _leaves(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Return, ast.Raise, ast.Continue)):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return callee_name(stmt.value) in ("exit", "_exit")
    return False


def _bound_names(fn: ast.AST) -> set[str]:
    """Names a function binds locally: parameters, assignment targets, loop and with names,
    imports and nested defs (minus those declared global/nonlocal)."""
    args = fn.args
    names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    declared: set[str] = set()
    stack = list(fn.body) if isinstance(fn.body, list) else [fn.body]
    while stack:
        node = stack.pop()
        if isinstance(node, FUNCTION):
            if not isinstance(node, ast.Lambda):
                names.add(node.name)
            continue  # its own scope
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return names - declared
