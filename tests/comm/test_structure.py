"""The shape of comm/ (issue 20, item 5): check rows keep their wire format and are read by name,
and no module of comm/ is part of an import cycle (none closed by a function-level import)."""

from __future__ import annotations

import ast
import os

import torch

import ringtrain.comm
from ringtrain.comm import checks

COMM = os.path.dirname(ringtrain.comm.__file__)
# Function-level imports allowed, each with its reason.
ALLOWED_INNER = {
    ("handles", ".."): "liveness is read only when a collective fails (which peer left first)",
}


def test_a_row_travels_as_the_same_flat_ints_as_before():
    call = checks.Call(checks.Kind.ALLGATHER, torch.float32, "cuda", op=2, root=1, shape=(3, 4), agree="x",
                       aux=3, held=2, held_digest=7)
    row = checks._encode(call)
    wire = row.wire()
    assert len(wire) == checks.WIDTH == 18
    # positions: magic, kind, dtype (+CUDA_FLAG), op, root, ndim, 8 dims, agree hash, aux, held, digest
    assert wire[:6] == [checks.MAGIC, int(checks.Kind.ALLGATHER), row.dtype, 2, 1, 2]
    assert row.dtype >= checks.CUDA_FLAG
    assert wire[6:14] == [3, 4] + [-1] * 6
    assert wire[14:] == [checks.hash_text("x"), 3, 2, 7]
    assert checks.Row.parse(wire) == row
    assert row.ours and not row.joined and not row.invalid
    assert row._replace(op=checks.INVALID_OP).invalid
    assert checks.describe(row) == "allgather(cuda float32[3, 4], op=Adasum, root_rank=1)"
    assert not checks.Row.parse([0] * checks.WIDTH).ours


def test_invalid_op_is_defined_once():
    from ringtrain.comm import validate

    assert validate.INVALID_OP is checks.INVALID_OP
    for name in os.listdir(COMM):
        if name.endswith(".py"):
            assert "-9" not in open(os.path.join(COMM, name)).read().replace("INVALID_OP = -9", ""), name


def _imports():
    """module -> (comm modules it imports, function-level imports as (module, target))."""
    modules = sorted(name[:-3] for name in os.listdir(COMM) if name.endswith(".py") and name != "__init__.py")
    found = {}
    for module in modules:
        tree = ast.parse(open(os.path.join(COMM, module + ".py")).read())
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                targets = [node.module] if node.module else [alias.name for alias in node.names]
                deps |= {t.split(".")[0] for t in targets if t.split(".")[0] in modules}
        inner = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, ast.ImportFrom):
                        inner.add((module, "." * node.level + (node.module or "")))
                    elif isinstance(node, ast.Import):
                        inner.add((module, node.names[0].name))
        found[module] = (deps, inner)
    return found


def test_comm_has_no_import_cycle():
    found = _imports()
    graph = {module: deps for module, (deps, _) in found.items()}
    done, stack = set(), []

    def visit(module):
        assert module not in stack, f"import cycle: {' -> '.join(stack[stack.index(module):] + [module])}"
        if module in done:
            return
        stack.append(module)
        for dep in sorted(graph[module]):
            visit(dep)
        stack.pop()
        done.add(module)

    for module in graph:
        visit(module)


def test_no_function_level_imports_but_the_explained_ones():
    inner = set().union(*(imports for _, imports in _imports().values()))
    assert inner <= set(ALLOWED_INNER), inner - set(ALLOWED_INNER)
