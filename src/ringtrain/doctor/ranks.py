"""Which tests pick out processes: ``if rank == 0``, ``if is_main_process()``, ``@rank_zero_only``.

Two readings, because the rules need both. :func:`singles_out_one_rank` is strict — a test
true on one process (or one per node) — for rules that report what the *other* ranks then
miss (a collective they never join). :func:`mentions_a_rank` is lenient — anything that
looks like it depends on the process — for rules where a guard means "not every rank does
this" and over-reading it can only hide a finding, never invent one (save-every-rank).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from .nodes import callee_name, identifiers, is_const

# Identifiers that name "which process am I": rank, local_rank, get_rank, is_main_process,
# is_master, global_zero (Lightning), ...
RANKISH = re.compile(r"rank|(^|_)(main|master|primary|chief|leader|root)(_|$)|global_zero|rank_zero")
# Identifiers that, compared with 0, pick one process in scripts that call the rank "gpu"
# (pytorch/examples: `if self.gpu_id == 0`, `args.gpu == 0`).
_DEVICEISH = re.compile(r"rank|gpu|device|proc|worker|node|local|(^|_)id$|(^|_)idx$")
# A flag or predicate true on the main process only (or one per node): is_main_process, args.is_master,
# trainer.is_global_zero, ring.is_local_main.
_MAIN_FLAG = re.compile(r"^(is_)?(local_|node_)?((main|master|primary|chief|leader|root)(_process|_proc|_rank|_worker|_node)?"
                        r"|global_zero|rank_?zero|rank_?0)$")
# Decorators that run a function on rank 0 only (Lightning's @rank_zero_only and look-alikes).
_RANK_ZERO_DECORATOR = re.compile(r"rank_zero|main_process|master_only|rank0|only_main")
# Names in a file path that make it one file per process: f"ckpt_rank{rank}.pt", shard_{local_rank}.
_PER_RANK_PATH = re.compile(r"rank|gpu|device|proc|worker|local|pid|shard")


def _tokens_match(expr: ast.AST, pattern: re.Pattern) -> bool:
    return any(pattern.search(name.lower()) for name in identifiers(expr))


def _zero_in(expr: ast.AST) -> bool:
    if is_const(expr, 0):
        return True
    return isinstance(expr, (ast.List, ast.Tuple, ast.Set)) and any(is_const(e, 0) for e in expr.elts)


def singles_out_one_rank(test: ast.AST) -> bool:
    """A test true on one process (or one per node): ``rank == 0``, ``local_rank in (-1, 0)``,
    ``args.rank % ngpus == 0``, ``is_main_process()``, ``not rank``. A comparison with -1
    alone (``local_rank != -1``: "am I distributed?") is true on every rank and does not count."""
    if isinstance(test, ast.BoolOp):
        return any(singles_out_one_rank(v) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        operand = test.operand
        return singles_out_one_rank(operand) or (
            _tokens_match(operand, RANKISH) and not isinstance(operand, ast.Compare))
    if isinstance(test, ast.Compare):
        sides = [test.left, *test.comparators]
        if not any(_tokens_match(s, RANKISH) for s in sides):
            return False
        return any(_zero_in(s) for s in sides)
    if isinstance(test, (ast.Name, ast.Attribute, ast.Call)):
        target = test.func if isinstance(test, ast.Call) else test
        last = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        return bool(_MAIN_FLAG.match(last.lower()))
    return False


def mentions_a_rank(test: ast.AST) -> bool:
    """Lenient: any test that looks like it depends on which process runs it."""
    if _tokens_match(test, RANKISH) or singles_out_one_rank(test):
        return True
    for node in ast.walk(test):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_zero_in(s) for s in sides) and any(_tokens_match(s, _DEVICEISH) for s in sides):
                return True
    return False


def decorator_guards(decorator: ast.expr) -> bool:
    """``@rank_zero_only``: the decorated function runs on rank 0 only."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return _tokens_match(target, _RANK_ZERO_DECORATOR)


def per_rank_path(options: list[ast.AST | None]) -> bool:
    """Is a save path (any of the expressions it may come from) one file per process,
    ``f"ckpt_rank{rank}.pt"``? A BytesIO is no file at all."""
    for origin in options:
        if origin is None:
            continue
        if any(_PER_RANK_PATH.search(name.lower()) for name in identifiers(origin)):
            return True
        if isinstance(origin, ast.Call) and callee_name(origin) in ("BytesIO", "StringIO"):
            return True
    return False


# Calls that seed torch's generator (Lightning's seed_everything and transformers' set_seed seed
# Python's, NumPy's and torch's); SEEDERS adds random.seed and np.random.seed.
TORCH_SEEDERS = ("manual_seed", "seed_everything", "set_seed")
SEEDERS = (*TORCH_SEEDERS, "seed")


def seeded_alike(script, seeders: tuple[str, ...] = SEEDERS) -> bool:
    """``torch.manual_seed(args.seed)`` with no rank in it, anywhere in the file: every rank
    draws the same numbers (the same initial weights, the same split). ``manual_seed(seed + rank)``
    does not count: it makes the ranks differ on purpose."""
    for call in script.calls:
        if callee_name(call) in seeders and call.args:
            if not any(RANKISH.search(n.lower()) for a in call.args for n in identifiers(a)):
                return True
    return False


def rank_guard(script: Any, node: ast.AST, depth: int = 3) -> tuple[bool | None, list[int]]:
    """``script.guarded(node, ...)`` with a rank check as the guard, and the lines of the checks it met."""
    lines: list[int] = []

    def one_rank(test: ast.AST) -> bool:
        if singles_out_one_rank(test):
            lines.append(test.lineno)
            return True
        return False

    return script.guarded(node, one_rank, depth=depth), lines
