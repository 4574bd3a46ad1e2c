"""Which device each rank uses: a device map that puts two ranks on one GPU.

A process that spans k devices (model parallel inside DDP) numbers them ``rank * k + i``.
Taking that ``% world_size`` folds k x world_size device numbers onto world_size of them:
whatever the world size, two ranks then share a device (with 4 ranks and k = 2, ranks 0 and
2 both get devices 0 and 1). The arithmetic is read only where it is plain: a known constant
k >= 2, the rank, and the world size (or the local one) as the modulus.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ..nodes import callee_name, identifiers
from ..script import Script

_WORLDISH = re.compile(r"world|^nprocs?$|num_proc|num_replicas")
_DEVICE_NAME = re.compile(r"dev|gpu|cuda")
_DEVICE_CALLS = {"to", "cuda", "set_device", "device", "set_device_index"}


def _int(script: Script, expr: ast.AST, depth: int = 2) -> int | None:
    """The integer an expression is: ``2``, or a name bound only to one (``k = 2``)."""
    if isinstance(expr, ast.Constant) and type(expr.value) is int:
        return expr.value
    if isinstance(expr, ast.Name) and depth:
        values = {_int(script, v, depth - 1) if v is not None else None for v in script.values(expr)}
        return values.pop() if len(values) == 1 else None
    return None


def _is_rank(expr: ast.AST) -> bool:
    """``rank``, ``args.local_rank``, ``dist.get_rank()``, ``hvd.rank()``."""
    target = expr.func if isinstance(expr, ast.Call) and not expr.args else expr
    name = (target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")).lower()
    return "rank" in name and not re.search(r"world|size|num|count|per|node", name)


def _linear_in_rank(script: Script, expr: ast.AST, depth: int = 2) -> tuple[int, int] | None:
    """(k, j) when ``expr`` is ``k * rank + j`` with constant k >= 2 (``rank * 2 + 1``, ``2 * rank``)."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        for factor, other in ((expr.left, expr.right), (expr.right, expr.left)):
            k = _int(script, factor)
            if k is not None and k >= 2 and _is_rank(other):
                return k, 0
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        for inner, const in ((expr.left, expr.right), (expr.right, expr.left)):
            j, found = _int(script, const), _linear_in_rank(script, inner, depth)
            if j is not None and found:
                return found[0], found[1] + j
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Sub):
        j, found = _int(script, expr.right), _linear_in_rank(script, expr.left, depth)
        if j is not None and found:
            return found[0], found[1] - j
    if isinstance(expr, ast.Name) and depth:
        values = script.values(expr)
        if len(values) == 1 and values[0] is not None:
            return _linear_in_rank(script, values[0], depth - 1)
    return None


def _is_world_size(script: Script, expr: ast.AST) -> bool:
    """The number of processes (``world_size``, ``dist.get_world_size()``, ``hvd.size()``, the local
    one), and nothing that may be the GPU count (``world_size = torch.cuda.device_count()``)."""
    options = [o for o in (expr, *script.origins(expr)) if o is not None]
    names = [n.lower() for o in options for n in identifiers(o)]
    if any("device_count" in n or "gpu" in n for n in names):
        return False
    return any(_WORLDISH.search(n) for n in names) or any(
        isinstance(o, ast.Call) and script.names.concept(o) == "hvd.size" for o in options) or any(
        isinstance(n, ast.Constant) and n.value in ("WORLD_SIZE", "LOCAL_WORLD_SIZE") for o in options for n in ast.walk(o))


def _names_a_device(script: Script, mod: ast.BinOp) -> bool:
    """Is the result used as a device: stored in ``dev0``/``gpu``, or passed to ``.to``, ``.cuda``,
    ``set_device``, ``torch.device``?"""
    node = mod
    parent = script.parent.get(node)
    while isinstance(parent, (ast.BinOp, ast.FormattedValue, ast.JoinedStr, ast.keyword, ast.List, ast.Tuple)):
        node, parent = parent, script.parent.get(parent)
    if isinstance(parent, ast.Call) and callee_name(parent) in _DEVICE_CALLS:
        return True
    if isinstance(parent, (ast.Assign, ast.AnnAssign)):
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        for target in targets:
            if isinstance(target, (ast.Name, ast.Attribute)):
                name = (target.id if isinstance(target, ast.Name) else target.attr).lower()
                if _DEVICE_NAME.search(name):
                    return True
                key = script.scope_of(target)
                if any(callee_name(call) in _DEVICE_CALLS for call, _ in script.passed_to.get(key, [])):
                    return True
    return False


def _collision(k: int, j: int) -> tuple[int, int, int, int]:
    """A world size and two ranks that ``(k * rank + j) % world_size`` puts on one device."""
    for world in (4, *range(2, 17)):
        seen: dict[int, int] = {}
        for rank in range(world):
            device = (k * rank + j) % world
            if device in seen:
                return world, seen[device], rank, device
            seen[device] = rank
    return 2 * k, 0, 2, j % (2 * k)  # a large prime k: 2k + j = j (mod 2k), ranks 0 and 2 meet


def ranks_share_device(script: Script) -> Iterator[tuple]:
    for node in script.nodes:
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod)):
            continue
        linear = _linear_in_rank(script, node.left)
        if linear is None or not _is_world_size(script, node.right) or not _names_a_device(script, node):
            continue
        k, j = linear
        world, a, b, device = _collision(k, j)
        modulus = script.text(node.right)
        yield (node,
               f"`{script.text(node)}` numbers {k} devices per rank ({k} x rank + i) but folds them with "
               f"% {modulus}: {k} x world_size device numbers land on world_size devices, so two ranks share a "
               f"GPU (with {world} ranks, ranks {a} and {b} both get device {device}): NCCL refuses a communicator "
               "with two ranks on one GPU (\"Duplicate GPU detected\"); under Gloo both processes run there, "
               "slower and with twice the memory, while other GPUs stay idle",
               f"give rank r its own devices r x {k} .. r x {k} + {k - 1} (no modulo: dev0 = rank * {k}, which "
               f"needs {k} x world_size GPUs, i.e. world_size = torch.cuda.device_count() // {k}), or reduce "
               "modulo the GPU count, never the world size")
