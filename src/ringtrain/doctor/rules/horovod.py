"""Rules about Horovod's recipe (horovod.torch, or ringtrain.horovod under the same names)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..nodes import callee_name, dotted, keyword
from ..ranks import TORCH_SEEDERS, seeded_alike
from ..script import Script

# Calls that can carry the model's weights from rank 0 (broadcast_optimizer_state cannot).
BROADCASTS_WEIGHTS = {"broadcast_parameters", "broadcast_variables", "broadcast_object", "broadcast", "broadcast_",
                      "broadcast_module"}


def _elastic_state(script: Script, expr: ast.AST) -> bool:
    """Is ``expr`` (possibly) an elastic state: ``hvd.elastic.TorchState(...)``, or a name the file does
    not show the value of and calls a state (``def train(state): ... state.sync()``)?"""
    origins = script.origins(expr)
    if any(isinstance(o, ast.Call) and (script.names.path(o.func) or "").startswith("horovod.torch.elastic.")
           for o in origins):
        return True
    return all(o is None or o is expr for o in origins) and "state" in (dotted(expr) or "").lower()


def _syncs_elastic_state(script: Script) -> bool:
    """Horovod's elastic mode broadcasts rank 0's state: ``@hvd.elastic.run`` calls ``state.sync()``
    (which broadcasts the model's parameters and the optimizer's state) before the function and
    after every reset; a script may also call ``state.sync()`` itself."""
    for node in script.nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if script.names.path(target) == "horovod.torch.elastic.run":
                    return True
    return any(callee_name(c) == "sync" and isinstance(c.func, ast.Attribute) and _elastic_state(script, c.func.value)
               for c in script.calls)


def hvd_broadcast(script: Script) -> Iterator[tuple]:
    wraps = script.concept_calls.get("hvd.DistributedOptimizer", [])
    if not wraps:
        return
    if any(callee_name(c) in BROADCASTS_WEIGHTS for c in script.calls) or seeded_alike(script, TORCH_SEEDERS):
        return
    if _syncs_elastic_state(script):
        return
    yield (wraps[0],
           "hvd.DistributedOptimizer without hvd.broadcast_parameters: each process starts from its own random "
           "weights (and a checkpoint loaded on rank 0 stays on rank 0); Horovod averages the gradients but "
           "never makes the weights equal",
           "after building the model and optimizer: hvd.broadcast_parameters(model.state_dict(), root_rank=0) and "
           "hvd.broadcast_optimizer_state(optimizer, root_rank=0); ringtrain's ring.setup broadcasts rank 0's weights")


def _mentions_size(script: Script, expr: ast.AST, depth: int = 3) -> bool:
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and script.names.concept(node) == "hvd.size":
            return True
        if depth and isinstance(node, (ast.Name, ast.Attribute)):
            if any(o is not None and o is not node and _mentions_size(script, o, depth - 1) for o in script.origins(node)):
                return True
    return False


def _adasum(script: Script, op: ast.AST | None) -> bool:
    origins = script.origins(op) if op is not None else [None]
    return all(isinstance(o, ast.Attribute) and o.attr == "Adasum" for o in origins)


def hvd_lr_scale(script: Script) -> Iterator[tuple]:
    wraps = script.concept_calls.get("hvd.DistributedOptimizer", [])
    if not wraps or any(callee_name(c) == "scale_lr" for c in script.calls):
        return
    if script.divides_batch_by_workers():
        return  # the global batch stays what it was: so may the learning rate
    for node in script.nodes:
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.Mult) and _mentions_size(script, node):
            return
    for wrap in wraps:
        if _adasum(script, keyword(wrap, "op")):
            continue  # Adasum does not want the learning rate scaled (Horovod's docs)
        inner = keyword(wrap, "optimizer", 0)
        built = [o for o in script.origins(inner) if isinstance(o, ast.Call)] if inner is not None else []
        at = built[0] if built else wrap
        lr = keyword(at, "lr", 1) if built else None
        rate = f"`{script.text(lr)}`" if lr is not None else "the learning rate"
        yield (at,
               f"{rate} is not scaled with hvd.size(): with N workers each step averages N x batch_size samples, "
               "and Horovod's recipe multiplies the single-worker rate by hvd.size() (linear scaling, Goyal et al. "
               "2017) — unless this rate was already tuned for the global batch",
               "lr = base_lr * hvd.size() (with a warm-up when N is large), or keep it and record why with "
               "`# ringtrain: ignore[hvd-lr-scale]`; op=hvd.Adasum needs no scaling; "
               "rt.scale_lr(base_lr, base_batch, global_batch) computes it")
        return
