"""Small questions about one syntax node: its dotted name, an argument, a constant."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

# Names that say a dataset, loader or sampler is for evaluation: val_set, test_loader, evalset...
_EVALISH = re.compile(r"(^|_)(val|valid|validation|test|testing|eval|evaluation|evaluate|holdout|dev)"
                      r"(_|$|set|data|ds|loader|sampler)", re.IGNORECASE)


def dotted(expr: ast.AST | None) -> str | None:
    """``self.model`` for ``self.model``; None for anything but names and attribute chains."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        base = dotted(expr.value)
        return None if base is None else f"{base}.{expr.attr}"
    return None


def iterated(expr: ast.AST, depth: int = 3) -> Iterator[ast.AST]:
    """The objects a ``for`` iterates: ``loader`` in ``enumerate(tqdm(loader))``."""
    if isinstance(expr, (ast.Name, ast.Attribute)):
        yield expr
    elif isinstance(expr, ast.Call) and depth:
        for arg in expr.args:
            yield from iterated(arg, depth - 1)


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


def position(node: ast.AST) -> tuple[int, int]:
    """Where a node starts: its order in the source."""
    return getattr(node, "lineno", 0), getattr(node, "col_offset", 0)
