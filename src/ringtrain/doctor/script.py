"""The parsed script the rules read: parents, scopes, assignments, calls and who calls whom.

Everything here is built once per file in a few linear walks over the tree (the whole
check of a 1,000-line script must stay well under a second). The model is deliberately
simple — flow-insensitive assignments per scope, calls matched to ``def``s by name —
because rules only report what it can justify, and skip what it cannot see.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Callable, Iterator

from .names import Names

FUNCTION = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
LOOP = (ast.For, ast.AsyncFor, ast.While)

# Identifiers that name "which process am I": rank, local_rank, get_rank, is_main_process,
# is_master, global_zero (Lightning), ...
_RANKISH = re.compile(r"rank|(^|_)(main|master|primary|chief|leader|root)(_|$)|global_zero|rank_zero")
# Identifiers that, compared with 0, pick one process in scripts that call the rank "gpu"
# (pytorch/examples: `if self.gpu_id == 0`, `args.gpu == 0`).
_DEVICEISH = re.compile(r"rank|gpu|device|proc|worker|node|local|(^|_)id$|(^|_)idx$")
# A flag or predicate true on the main process only: is_main_process, args.is_master, trainer.is_global_zero.
_MAIN_FLAG = re.compile(r"^(is_)?((main|master|primary|chief|leader|root)(_process|_proc|_rank|_worker|_node)?"
                        r"|global_zero|rank_?zero|rank_?0)$")
_EVALISH = re.compile(r"(^|_)(val|valid|validation|test|testing|eval|evaluation|evaluate|holdout|dev)(_|$|set|data|ds|loader|sampler)",
                      re.IGNORECASE)


def dotted(expr: ast.AST) -> str | None:
    """``self.model`` for ``self.model``; None for anything but names and attribute chains."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        base = dotted(expr.value)
        return None if base is None else f"{base}.{expr.attr}"
    return None


def identifiers(expr: ast.AST) -> Iterator[str]:
    """Every name and attribute name inside an expression."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr


def callee_name(call: ast.Call) -> str | None:
    """``step`` for ``optimizer.step()``, ``train`` for ``train(...)``."""
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def keyword(call: ast.Call, name: str, position: int | None = None) -> ast.expr | None:
    """The argument passed as ``name=`` (or at ``position``), or None."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if position is not None and len(call.args) > position and not any(
            isinstance(a, ast.Starred) for a in call.args[:position + 1]):
        return call.args[position]
    return None


def is_const(expr: ast.AST | None, value) -> bool:
    return isinstance(expr, ast.Constant) and type(expr.value) is type(value) and expr.value == value


def is_evalish(text: str | None) -> bool:
    return bool(text) and bool(_EVALISH.search(text.split(".")[-1]))


def _tokens_match(expr: ast.AST, pattern: re.Pattern) -> bool:
    return any(pattern.search(name.lower()) for name in identifiers(expr))


def _zero_in(expr: ast.AST) -> bool:
    if is_const(expr, 0):
        return True
    return isinstance(expr, (ast.List, ast.Tuple, ast.Set)) and any(is_const(e, 0) for e in expr.elts)


def singles_out_one_rank(test: ast.AST) -> bool:
    """A test true on one process (or one per node): ``rank == 0``, ``local_rank in (-1, 0)``,
    ``args.rank % ngpus == 0``, ``is_main_process()``, ``not rank``; strict, for rules
    that report what happens on the other ranks."""
    if isinstance(test, ast.BoolOp):
        return any(singles_out_one_rank(v) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        operand = test.operand
        return singles_out_one_rank(operand) or (_tokens_match(operand, _RANKISH) and not isinstance(operand, ast.Compare))
    if isinstance(test, ast.Compare):
        sides = [test.left, *test.comparators]
        if not any(_tokens_match(s, _RANKISH) for s in sides):
            return False
        return any(_zero_in(s) for s in sides)
    if isinstance(test, (ast.Name, ast.Attribute, ast.Call)):
        target = test.func if isinstance(test, ast.Call) else test
        last = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        return bool(_MAIN_FLAG.match(last.lower()))
    return False


def mentions_a_rank(test: ast.AST) -> bool:
    """Lenient: any test that looks like it depends on which process runs it. Used where a
    guard means "not every rank does this" and over-reading it only hides findings."""
    if _tokens_match(test, _RANKISH) or singles_out_one_rank(test):
        return True
    for node in ast.walk(test):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_zero_in(s) for s in sides) and any(_tokens_match(s, _DEVICEISH) for s in sides):
                return True
    return False


class Script:
    """One parsed file and the indexes the rules share."""

    def __init__(self, path: str, source: str, tree: ast.Module):
        self.path = path
        self.source = source
        self.tree = tree
        self.names = Names(tree)
        self.parent: dict[ast.AST, ast.AST] = {}
        self.calls: list[ast.Call] = []
        self.defs: dict[str, list[ast.AST]] = defaultdict(list)  # function or class name -> defs
        self._callers: dict[str, list[ast.Call]] = defaultdict(list)
        self.concept_calls: dict[str, list[ast.Call]] = defaultdict(list)
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
            if isinstance(node, ast.Call):
                self.calls.append(node)
                name = callee_name(node)
                if name:
                    self._callers[name].append(node)
                concept = self.names.concept(node)
                if concept:
                    self.concept_calls[concept].append(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs[node.name].append(node)
        self.calls.sort(key=_position)
        self._locals = {fn: _bound_names(fn) for fn in ast.walk(tree) if isinstance(fn, FUNCTION)}
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

    def callees(self, call: ast.Call) -> list[ast.AST]:
        name = callee_name(call)
        return [d for d in self.defs.get(name, []) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))] if name else []

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
        if any(_decorator_guards(d) for d in getattr(fn, "decorator_list", [])):
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

    def values(self, expr: ast.AST, before: ast.AST | None = None) -> list[ast.expr]:
        """What a name may hold: the right-hand sides assigned to it in its scope (those
        before ``before`` when given; None for a binding with no visible value)."""
        key = self.scope_of(expr)
        if key is None:
            return []
        found = self.assignments.get(key, [])
        if before is not None:
            found = [(s, v) for s, v in found if _position(s) < _position(before)]
        return [v for _, v in found]

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

    def is_concept(self, expr: ast.AST | None, concept: str) -> bool:
        """Does ``expr`` (possibly) hold the result of a call to ``concept``?"""
        return any(isinstance(o, ast.Call) and self.names.concept(o) == concept for o in self.origins(expr))

    def same_value(self, a: ast.AST, b: ast.AST) -> bool:
        """Do two names (possibly) refer to the same object, through plain assignments?"""
        ka, kb = self.scope_of(a), self.scope_of(b)
        if ka is None or kb is None:
            return True  # unknown: assume the same, never report on it
        if ka == kb:
            return True
        oa = {self.scope_of(o) for o in self.origins(a) if isinstance(o, (ast.Name, ast.Attribute))} | {ka}
        ob = {self.scope_of(o) for o in self.origins(b) if isinstance(o, (ast.Name, ast.Attribute))} | {kb}
        return bool(oa & ob) or any(o is None for o in self.values(a) + self.values(b))

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
        for node in ast.walk(self.tree):
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
                # `for loader in (train_loader, val_loader)`: the loop name is each element.
                if isinstance(node.iter, (ast.Tuple, ast.List)) and not isinstance(node.target, (ast.Tuple, ast.List)):
                    for element in node.iter.elts:
                        self._bind(node.target, element, node)
                else:
                    self._bind(node.target, None, node)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        self._bind(item.optional_vars, None, node)
        for entries in self.assignments.values():
            entries.sort(key=lambda e: _position(e[0]))

    # --- facts about the whole script ------------------------------------------------

    def has_concept(self, *concepts: str) -> bool:
        return any(self.concept_calls.get(c) for c in concepts)

    def is_distributed(self) -> bool:
        """Does the script run as several processes (torch.distributed, DDP, Horovod, spawn)?"""
        if self.has_concept("init_process_group", "DDP", "DistributedSampler", "spawn", "hvd.init",
                            "hvd.DistributedOptimizer"):
            return True
        return any(self.names.is_horovod(c.func) for c in self.calls)

    def uses_cuda(self) -> bool:
        """Does anything in the script put work on a CUDA device?"""
        for node in ast.walk(self.tree):
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


def _position(node: ast.AST) -> tuple[int, int]:
    return getattr(node, "lineno", 0), getattr(node, "col_offset", 0)


def _leaves(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Return, ast.Raise, ast.Continue)):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return callee_name(stmt.value) in ("exit", "_exit")
    return False


def _decorator_guards(decorator: ast.expr) -> bool:
    """Lightning's ``@rank_zero_only`` and look-alikes."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return _tokens_match(target, re.compile(r"rank_zero|main_process|master_only|rank0|only_main"))


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
