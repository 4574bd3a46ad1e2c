"""A process group and a sharding sampler on a path where the model is never wrapped.

``if use_gpu: model = DDP(model.cuda(), device_ids=[rank])`` with no ``else``: on the CPU path
the group still forms and the DistributedSampler still gives each rank its shard, but nothing
averages the gradients, so every rank trains its own model on its own part of the data.

The rule looks at each ``if`` around a wrap (DistributedDataParallel, FSDP, fully_shard,
hvd.DistributedOptimizer), directly or around a call of the helper that wraps. It reports
the arm that does not wrap only when the ``if`` picks a device (``cuda``, ``gpu``, ``accel``,
``device.type``, the backend...) — a branch on "am I distributed?" has a single-process arm by
design —, when nothing on the way to that arm says "not distributed", when the arm does not
leave (``return``, ``raise``), when its function wraps nowhere outside that ``if`` (a sibling
``if`` may cover the other device), and when the group and the sampler are not confined to the
other arm.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ..nodes import callee_name, identifiers
from ..script import Script

WRAPS = ("DDP", "FSDP", "fully_shard", "hvd.DistributedOptimizer")
# Calls that may wrap a model (apex's DDP, accelerate's prepare, deepspeed.initialize, ring.setup,
# a helper named after what it does): an arm that calls one is taken as wrapping.
_MAY_WRAP = re.compile(r"ddp|distributeddataparallel|distributedoptimizer|fsdp|fully_?shard|shard_model|(^|_)wrap"
                       r"|^(prepare|prepare_model|initialize|replicate|parallelize|parallelize_module)$")
_DEVICE_TEST = re.compile(r"cuda|gpu|accel|device|cpu|mps|xpu|npu|hpu|tpu|nccl|gloo|backend")
_DISTRIBUTED = re.compile(r"distributed|(^|_)ddp($|_)|is_initialized|(^|_)dist($|_)|is_dist|multiprocessing")
_WORLD = re.compile(r"world_size|num_replicas|nprocs?$|num_processes")


def _wraps(script: Script, call: ast.Call) -> bool:
    return script.names.concept(call) in WRAPS or callee_name(call) in ("DistributedDataParallel",
                                                                         "FullyShardedDataParallel")


def _may_wrap(script: Script, call: ast.Call) -> bool:
    if script.names.concept(call) == "DP":
        return False  # one process's GPUs: nothing crosses processes
    name = callee_name(call) or ""
    return _wraps(script, call) or bool(_MAY_WRAP.search(name.lower())) or (
        name == "setup" and isinstance(call.func, ast.Attribute))


def _arm_wraps(script: Script, arm: list) -> bool:
    return any(_may_wrap(script, c) for node in arm for c in script.calls_in(node, depth=2))


def _leaves(arm: list) -> bool:
    for stmt in arm:
        if isinstance(stmt, (ast.Return, ast.Raise)):
            return True
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and callee_name(stmt.value) in ("exit", "_exit"):
            return True
    return False


def _distributed_when(test: ast.AST, truth: bool) -> bool | None:
    """Is the process distributed when ``test`` is ``truth``? None when the test does not say."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _distributed_when(test.operand, not truth)
    if isinstance(test, ast.BoolOp):
        # `a and b` true: both true; `a or b` false: both false. The other cases say nothing.
        if isinstance(test.op, ast.And) == truth:
            verdicts = {_distributed_when(v, truth) for v in test.values} - {None}
            return verdicts.pop() if len(verdicts) == 1 else None
        return None
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        names = [n.lower() for n in identifiers(test)]
        other = test.comparators[0]
        value = other.value if isinstance(other, ast.Constant) else (
            -other.operand.value if isinstance(other, ast.UnaryOp) and isinstance(other.operand, ast.Constant) else None)
        op = type(test.ops[0])
        if any(_WORLD.search(n) for n in names) and value == 1:
            more = {ast.Gt: True, ast.NotEq: True, ast.Eq: False, ast.LtE: False}.get(op)
            return None if more is None else more == truth
        if any("rank" in n for n in names) and value == -1:
            more = {ast.NotEq: True, ast.Gt: True, ast.Eq: False}.get(op)
            return None if more is None else more == truth
        return None
    target = test.func if isinstance(test, ast.Call) else test
    if isinstance(target, (ast.Name, ast.Attribute)):
        last = (target.attr if isinstance(target, ast.Attribute) else target.id).lower()
        if _DISTRIBUTED.search(last):
            return truth
    return None


def _path(script: Script, node: ast.AST) -> list[tuple[ast.AST, ast.AST, bool]]:
    """The ``if``s on the way to ``node`` in its function: (the if, its test, the side taken)."""
    return [(branch, branch.test, in_body) for branch, in_body in script.branches_around(node)]


def _sites(script: Script, node: ast.AST, depth: int = 2) -> list[ast.AST]:
    """``node``, and the calls of the helper it sits in (``setup()`` forming the group)."""
    sites = [node]
    fn = script.function_of(node)
    if depth and fn is not script.tree:
        for caller in script.callers(fn):
            sites += _sites(script, caller, depth - 1)
    return sites


def _excludes(script: Script, arm_path: list, site: ast.AST) -> bool:
    """Does taking the arm rule out reaching ``site``: the other side of one of the arm's ``if``s,
    or of an ``if`` with the same test?"""
    for branch, test, side in _path(script, site):
        for arm_branch, arm_test, arm_side in arm_path:
            if side != arm_side and (branch is arm_branch or script.text(test) == script.text(arm_test)):
                return True
    return False


def _reached(script: Script, arm_path: list, calls: list[ast.Call]) -> ast.Call | None:
    for call in calls:
        if any(not _excludes(script, arm_path, site) for site in _sites(script, call)):
            return call
    return None


def _wrapped_elsewhere(script: Script, branch: ast.AST, arm_path: list) -> bool:
    """Does the function holding ``branch`` (maybe) wrap outside it, on a path the arm does not rule
    out: a sibling ``if BACKEND == "nccl":`` after ``if BACKEND == "gloo":``, a wrap after the ``if``?"""
    scope = script.function_of(branch)
    return any(isinstance(node, ast.Call) and script.function_of(node) is scope and not script.inside(node, branch)
               and not _excludes(script, arm_path, node)
               and any(_may_wrap(script, c) for c in script.calls_in(node, depth=2))
               for node in ast.walk(scope))


def _unwrapped_arms(script: Script, wrap: ast.Call) -> Iterator[tuple[ast.AST, bool]]:
    """(an ``if`` around the wrap, the side that does not wrap)."""
    for site in _sites(script, wrap):
        for branch, in_body in script.branches_around(site):
            if isinstance(branch, ast.IfExp):
                other = [branch.orelse if in_body else branch.body]
            else:
                other = branch.orelse if in_body else branch.body
            if not _arm_wraps(script, other) and not _leaves(other):
                yield branch, not in_body


def model_not_wrapped(script: Script) -> Iterator[tuple]:
    groups = [*script.concept_calls.get("init_process_group", []), *script.concept_calls.get("hvd.init", [])]
    samplers = script.concept_calls.get("DistributedSampler", [])
    if not groups or not samplers or not any(callee_name(c) == "backward" for c in script.calls):
        return
    reported: set[int] = set()
    for wrap in (c for c in script.calls if _wraps(script, c)):
        for branch, side in _unwrapped_arms(script, wrap):
            words = [n.lower() for n in identifiers(branch.test)] + [
                n.value.lower() for n in ast.walk(branch.test) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            if id(branch) in reported or not any(_DEVICE_TEST.search(w) for w in words):
                continue
            arm_path = [(branch, branch.test, side)] + _path(script, branch)
            if any(_distributed_when(test, taken) is False for _, test, taken in arm_path):
                continue  # the single-process path
            if _wrapped_elsewhere(script, branch, arm_path):
                continue
            group, sampler = _reached(script, arm_path, groups), _reached(script, arm_path, samplers)
            if group is None or sampler is None:
                continue
            reported.add(id(branch))
            when = f"`{script.text(branch.test)}` is {'true' if side else 'false'}"
            yield (branch,
                   f"when {when}, the model is never wrapped (the wrap at line {wrap.lineno} runs only on the other side "
                   f"of this `if`), yet the process group forms (line {group.lineno}) and a DistributedSampler "
                   f"shards the data (line {sampler.lineno}): every rank trains its own model on its own shard, "
                   "nothing averages the gradients, and the replicas drift apart",
                   "wrap on every path that forms the group — on the CPU, DistributedDataParallel(model) without "
                   "device_ids runs on Gloo — or do not form the group (nor shard the data) on this path; "
                   "ringtrain's ring.setup(model, optimizer) wraps on every device")
