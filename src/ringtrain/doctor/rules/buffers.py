"""Does a wrapped model have buffers, as far as the file shows? DDP's forward broadcasts ``module.buffers()``
(BatchNorm's running statistics, a mask registered with ``register_buffer``) from rank 0; a model without any
broadcasts nothing, so a forward on one rank then hangs nobody.

The model is followed from the wrap back to what built it — names, ``.to(device)`` and the like, a local
function's return value, a helper's parameter — and into the classes of this file it instantiates (their
methods, their base classes, the classes and constructors they call). Three answers: "yes" (a BatchNorm layer,
or a ``register_buffer`` that always runs), "maybe" (a ``register_buffer`` only under an ``if``: nanoGPT registers
its causal mask only when flash attention is missing, torch < 2.0), None (the file does not show).
"""

from __future__ import annotations

import ast
import re

from ..nodes import callee_name, is_const, keyword
from ..script import FUNCTION, Script

# torch.nn layers with buffers by default: BatchNorm's running mean, variance and batch count.
_BATCHNORM = re.compile(r"^(Lazy)?(Sync)?BatchNorm([123]d)?$")
_SAME_MODULE = {"to", "cuda", "cpu", "float", "half", "bfloat16", "train", "eval", "to_empty", "requires_grad_"}
_PASS_THROUGH = {"compile", "convert_sync_batchnorm", "DistributedDataParallel", "DDP", "FullyShardedDataParallel",
                 "fully_shard", "setup"}

Verdict = tuple[str, ast.AST]  # ("yes" or "maybe", the node that shows it)


class Buffers:
    def __init__(self, script: Script):
        self.script = script
        self._classes: dict[int, Verdict | None] = {}

    def of(self, module: ast.AST | None, depth: int = 6) -> Verdict | None:
        """The verdict for a module expression (the argument of a wrap)."""
        found = self._expr(module, depth, set())
        return found

    def _expr(self, expr: ast.AST | None, depth: int, seen: set[int]) -> Verdict | None:
        script = self.script
        if expr is None or depth == 0 or id(expr) in seen:
            return None
        seen.add(id(expr))
        if isinstance(expr, (ast.Name, ast.Attribute)):
            options = [v for v in script.values(expr) if v is not None]
            if isinstance(expr, ast.Name):
                options += script.arguments(expr)
            return _best(self._expr(o, depth - 1, seen) for o in options)
        if isinstance(expr, ast.IfExp):
            return _best(self._expr(o, depth - 1, seen) for o in (expr.body, expr.orelse))
        if not isinstance(expr, ast.Call):
            return None
        name = callee_name(expr) or ""
        if isinstance(expr.func, ast.Attribute) and name in _SAME_MODULE:
            return self._expr(expr.func.value, depth - 1, seen)
        if name in _PASS_THROUGH and (expr.args or expr.keywords):
            inner = expr.args[0] if expr.args else keyword(expr, "module") or keyword(expr, "model")
            return self._expr(inner, depth - 1, seen)
        return self._construction(expr, depth, seen)

    def _construction(self, call: ast.Call, depth: int, seen: set[int]) -> Verdict | None:
        """A call that builds a module: a BatchNorm layer, a class of this file, a local function's return value,
        a container (``nn.Sequential(...)``) of any of these."""
        script = self.script
        name = callee_name(call) or ""
        if _BATCHNORM.match(name) and not is_const(keyword(call, "track_running_stats"), False):
            return "yes", call
        verdicts = []
        for d in script.defs.get(name, []):
            if isinstance(d, ast.ClassDef):
                verdicts.append(self._class(d, depth))
            elif isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)):
                verdicts += [self._expr(r, depth - 1, seen) for r in script.returned(call) if r is not None]
                verdicts += [self._inside(d, depth)]
        for arg in (*call.args, *(k.value for k in call.keywords)):
            for sub in ast.walk(arg):
                if isinstance(sub, ast.Call):
                    verdicts.append(self._construction(sub, depth - 1, seen))
        return _best(verdicts)

    def _inside(self, body: ast.AST, depth: int) -> Verdict | None:
        """What a function (or a class's method) builds: BatchNorm layers and classes of this file it calls, and
        its ``register_buffer`` calls — "yes" when one runs on every path through the function, else "maybe"."""
        verdicts = []
        for sub in ast.walk(body):
            if not isinstance(sub, ast.Call):
                continue
            name = callee_name(sub) or ""
            if name == "register_buffer":
                conditional = any(isinstance(b, ast.If) for b, _ in self.script.branches_around(sub))
                verdicts.append(("maybe" if conditional else "yes", sub))
            elif _BATCHNORM.match(name) and not is_const(keyword(sub, "track_running_stats"), False):
                verdicts.append(("yes", sub))
            elif depth > 1:
                verdicts += [self._class(d, depth - 1) for d in self.script.defs.get(name, [])
                             if isinstance(d, ast.ClassDef)]
        return _best(verdicts)

    def _class(self, cls: ast.ClassDef, depth: int) -> Verdict | None:
        if id(cls) in self._classes:
            return self._classes[id(cls)]
        self._classes[id(cls)] = None  # a class that builds itself stops here
        verdicts = [self._inside(m, depth) for m in cls.body if isinstance(m, FUNCTION)]
        for base in cls.bases:
            base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
            verdicts += [self._class(d, depth - 1) for d in self.script.defs.get(base_name, [])
                         if isinstance(d, ast.ClassDef) and d is not cls and depth > 1]
        self._classes[id(cls)] = found = _best(verdicts)
        return found


def _best(verdicts) -> Verdict | None:
    found = None
    for verdict in verdicts:
        if verdict is None:
            continue
        if verdict[0] == "yes":
            return verdict
        found = found or verdict
    return found
