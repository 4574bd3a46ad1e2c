"""Rules about wrapping the model: DDP and its device, SyncBatchNorm, no_sync, DataParallel."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ..nodes import callee_name, dotted, identifiers, is_const, keyword, position
from ..script import Script
from .process_group import nccl_inits

MOVERS = {"to", "cuda", "to_empty", "xpu"}
# Model constructors that build on the CPU (unless told a device, or the default device is
# changed, which the rule checks separately). Not torch.load, torch.jit.load, torch.hub: a
# loaded module is wherever it was saved.
_CPU_BUILDERS = ("torch.nn.", "torchvision.models.", "timm.create_model", "timm.models.", "monai.networks.",
                 "torchaudio.models.", "segmentation_models_pytorch.")


def _moves(call: ast.AST) -> bool:
    return isinstance(call, ast.Call) and callee_name(call) in MOVERS and isinstance(call.func, ast.Attribute)


def _chain_moves(expr: ast.AST) -> bool:
    """``Net().to(device)``, ``model.cuda()``, ``model.to(dev).train()``."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        if _moves(expr):
            return True
        expr = expr.func.value
    return False


def _builds_on_cpu(script: Script, call: ast.Call) -> bool | None:
    """True when ``call`` constructs a model that this file shows lands on the CPU."""
    if any(kw.arg in ("device", "device_map") or kw.arg is None for kw in call.keywords):
        return None
    defs = script.defs.get(callee_name(call) or "", [])
    if defs:
        for d in defs:
            for sub in ast.walk(d):
                if _moves(sub) or (isinstance(sub, ast.Name) and "device" in sub.id.lower()):
                    return None
        return True
    path = script.names.path(call.func)
    if path and path.startswith(_CPU_BUILDERS):
        return True
    name = callee_name(call)
    if isinstance(call.func, ast.Name) and name and name[:1].isupper():
        return True  # `Net()`, `ResNet18()`: a class constructor
    return None  # a factory we cannot see into (it may move the model)


def _built_moved(script: Script, call: ast.Call, at: ast.AST, depth: int) -> bool | None:
    """Is the model a call returns on a device? True (moved in the chain), False (built on
    the CPU and not moved), None (cannot tell)."""
    if _chain_moves(call):
        return True
    passed = [a for a in call.args if isinstance(a, (ast.Name, ast.Attribute))]
    name = callee_name(call) or ""
    if passed and not name[:1].isupper():
        # convert_sync_batchnorm(model), torch.compile(model): the model keeps its device
        return _moved_before(script, passed[0], at, depth - 1)
    if passed and any(_moved_before(script, a, at, depth - 1) for a in passed):
        return None  # nn.Sequential(backbone, head) of modules already moved
    return False if _builds_on_cpu(script, call) else None


def _moved_before(script: Script, module: ast.AST, at: ast.AST, depth: int = 4) -> bool | None:
    """Is ``module`` on a device when ``at`` runs? True, False, or None (cannot tell)."""
    if depth == 0:
        return None
    if isinstance(module, ast.Call):
        return _built_moved(script, module, at, depth)
    key = script.scope_of(module)
    if key is None:
        return None
    earlier = [(stmt, value) for stmt, value in script.assignments.get(key, [])
               if position(stmt) < position(at) and not script.inside(at, stmt)]
    if not earlier:
        return None  # a parameter or a global set elsewhere
    stmt, value = earlier[-1]
    if script.function_of(stmt) is not script.function_of(at) and script.function_of(at) is not script.tree:
        return None
    if _in_branch_apart(script, stmt, at):
        # `if gpu: model = Net().cuda() / else: model = Net()`: the last assignment written is
        # one branch among others; report only when every one of them is on the CPU
        verdicts = {_moved_value(script, v, s, depth) for s, v in earlier}
        return False if verdicts == {False} else None
    for call in script.calls:
        if position(stmt) < position(call) < position(at) and _moves(call) \
                and script.scope_of(call.func.value) == key:
            return True
    return _moved_value(script, value, stmt, depth)


def _moved_value(script: Script, value: ast.expr | None, stmt: ast.AST, depth: int) -> bool | None:
    """Is the value assigned by ``stmt`` on a device?"""
    if value is None or isinstance(value, ast.Constant):
        return None  # `model = ...` in a tutorial: we do not know
    if isinstance(value, ast.Call) and script.names.concept(value) in ("DDP", "DP"):
        return None
    if isinstance(value, (ast.Name, ast.Attribute)):
        return _moved_before(script, value, stmt, depth - 1)
    if isinstance(value, ast.Call):
        return _built_moved(script, value, stmt, depth)
    return None


def _in_branch_apart(script: Script, stmt: ast.AST, at: ast.AST) -> bool:
    """Is ``stmt`` inside an ``if`` (or loop, or try) that does not also hold ``at``?"""
    for a in script.ancestors(stmt):
        if script.inside(at, a):
            return False
        if isinstance(a, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.With)):
            return True
    return False


def _default_device_changed(script: Script) -> bool:
    for call in script.calls:
        if callee_name(call) == "set_default_device":
            return True
    for node in script.nodes:
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if "device" in {n.lower() for n in identifiers(item.context_expr)}:
                    return True
    return False


def ddp_before_to(script: Script) -> Iterator[tuple]:
    wraps = script.concept_calls.get("DDP", [])
    if not wraps or _default_device_changed(script):
        return
    # Under NCCL a CPU module fails too (NCCL cannot broadcast it); without any CUDA in the
    # script that is nccl-without-cuda's finding, not this one.
    nccl = bool(nccl_inits(script)) and script.uses_cuda()
    for wrap in wraps:
        module = keyword(wrap, "module", 0)
        if module is None:
            continue
        device_ids = keyword(wrap, "device_ids", 1)
        # `device_ids=[gpu] if gpu is not None else None`: on the CPU path there is nothing to check
        on_gpu = (device_ids is not None and not any(is_const(o, None) for o in script.origins(device_ids))) or nccl
        if not on_gpu or _moved_before(script, module, wrap) is not False:
            continue
        name = dotted(module) or "the model"
        yield (wrap,
               f"{name} is wrapped in DistributedDataParallel while its parameters are still on the CPU: "
               "with device_ids (or NCCL) DDP needs a module on its GPU and raises ValueError "
               "(\"... only work with single-device GPU modules\"); moving it after the wrap is too late",
               f"move it first, then wrap: {name}.to(device); DDP({name}, device_ids=[local_rank]); "
               "ringtrain's ring.setup(model, optimizer) moves, then wraps")


def syncbn_after_ddp(script: Script) -> Iterator[tuple]:
    for conv in script.concept_calls.get("convert_sync_batchnorm", []):
        arg = keyword(conv, "module", 0)
        if arg is None:
            continue
        inner = arg.value if isinstance(arg, ast.Attribute) and arg.attr == "module" else None
        for wrap in script.concept_calls.get("DDP", []):
            if script.function_of(wrap) is not script.function_of(conv) or position(wrap) >= position(conv):
                continue
            if _exclusive(script, wrap, conv):
                continue
            wrapped = keyword(wrap, "module", 0)
            keys = {script.scope_of(t) for t in _targets(script, wrap)}
            if wrapped is not None:
                keys.add(script.scope_of(wrapped))
            keys.discard(None)
            if script.scope_of(arg) in keys or (inner is not None and script.scope_of(inner) in keys):
                yield (conv,
                       f"convert_sync_batchnorm runs after the DistributedDataParallel wrap (line {wrap.lineno}): "
                       "torch < 1.9 then fails in the first forward (\"SyncBatchNorm is only supported within "
                       "torch.nn.parallel.DistributedDataParallel\"); newer versions run it only because the "
                       "conversion reuses the parameter and buffer objects DDP registered, and skip the checks DDP "
                       "makes on SyncBatchNorm layers when it wraps",
                       "convert first, then wrap: model = nn.SyncBatchNorm.convert_sync_batchnorm(model); "
                       "model = DDP(model, ...); ringtrain: Ring(sync_batchnorm=True), which also works on CPU/Gloo")
                break


def _targets(script: Script, value: ast.AST) -> list[ast.expr]:
    parent = script.parent.get(value)
    if isinstance(parent, ast.Assign):
        return [t for t in parent.targets if isinstance(t, (ast.Name, ast.Attribute))]
    return []


def _exclusive(script: Script, a: ast.AST, b: ast.AST) -> bool:
    """Are ``a`` and ``b`` in different branches of one ``if``?"""
    branches_a = {id(branch): in_body for branch, in_body in script.branches_around(a)}
    return any(id(branch) in branches_a and branches_a[id(branch)] != in_body
               for branch, in_body in script.branches_around(b))


def _optimizer_step(script: Script, call: ast.Call) -> bool:
    """``optimizer.step()`` or ``scaler.step(optimizer)``; not a scheduler's step."""
    if callee_name(call) != "step" or not isinstance(call.func, ast.Attribute):
        return False
    receiver = (dotted(call.func.value) or "").lower()
    if "sched" in receiver or "lr" in receiver.split(".")[-1]:
        return False
    if re.search(r"optim|opt$|^opt|scaler|solver", receiver.split(".")[-1]):
        return True
    return any(isinstance(o, ast.Call) and (script.names.path(o.func) or "").startswith(("torch.optim.", "horovod.torch."))
               for o in script.origins(call.func.value))


def _counts_modulo(script: Script, test: ast.AST) -> bool:
    """``(i + 1) % k == 0``, also through a name: ``boundary = (i + 1) % k == 0; if boundary:``."""
    for node in ast.walk(test):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            return True
        if isinstance(node, ast.Name) and any(
                v is not None and any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(v))
                for v in script.values(node)):
            return True
    return False


def _under_modulo_if(script: Script, node: ast.AST, loop: ast.AST) -> bool:
    for branch, _ in script.branches_around(node):
        if not script.inside(branch, loop):
            return False
        if _counts_modulo(script, branch.test):
            return True
    return False


def _skips_unless_modulo(script: Script, step: ast.Call, loop: ast.AST) -> bool:
    """``if (i + 1) % k != 0: continue`` earlier in the loop body."""
    for stmt in loop.body:
        if stmt.lineno >= step.lineno:
            break
        if isinstance(stmt, ast.If) and isinstance(stmt.body[-1], ast.Continue) and _counts_modulo(script, stmt.test):
            return True
    return False


def accumulate_no_sync(script: Script) -> Iterator[tuple]:
    if not script.has_concept("DDP"):
        return
    for node in script.nodes:
        if isinstance(node, ast.Attribute) and node.attr in ("no_sync", "require_backward_grad_sync"):
            return  # the script manages DDP's synchronisation itself
    reported: set[int] = set()
    for loop in script.nodes:
        if not isinstance(loop, (ast.For, ast.AsyncFor, ast.While)):
            continue
        body_calls = [c for stmt in loop.body for c in ast.walk(stmt) if isinstance(c, ast.Call)]
        steps = [c for c in body_calls if _optimizer_step(script, c)]
        if not steps or not all(_under_modulo_if(script, s, loop) or _skips_unless_modulo(script, s, loop)
                                for s in steps):
            continue
        for stmt in loop.body:
            for backward in script.calls_in(stmt, depth=1):
                if callee_name(backward) != "backward" or id(backward) in reported:
                    continue
                if script.inside(backward, loop) and _under_modulo_if(script, backward, loop):
                    continue
                if script.inside(backward, loop) and script.enclosing_loops(backward)[0] is not loop:
                    continue  # an inner loop's backward: that loop is the one to judge
                reported.add(id(backward))
                yield (backward,
                       "gradient accumulation under DistributedDataParallel without no_sync(): the optimizer "
                       f"steps only every k micro-batches (line {steps[0].lineno}), but every backward() "
                       "all-reduces the gradients — k-1 of every k all-reduces are wasted",
                       "run the backward of micro-batches that do not step under `with model.no_sync():` "
                       "(the model being the DDP wrapper); ringtrain: Ring(accumulate=k) and ring.backward(loss) "
                       "skip DDP's all-reduce inside the window and divide the loss by k")


def dataparallel_batch(script: Script) -> Iterator[tuple]:
    wraps = script.concept_calls.get("DP", [])
    if not wraps:
        return
    if script.divides_batch_by_workers():
        return  # the author already converts between the two meanings
    wrap = wraps[0]
    yield (wrap,
           "nn.DataParallel splits each batch across the visible GPUs: the DataLoader's batch_size is the global "
           "batch (batch_size / n per GPU); under DistributedDataParallel the same batch_size is per process, "
           "n times larger in total",
           "when moving to DDP, divide the batch size by the number of processes to keep the global batch (and "
           "the learning rate); in ringtrain, batch_size is per device in every strategy (dp, ddp, hvd)")
