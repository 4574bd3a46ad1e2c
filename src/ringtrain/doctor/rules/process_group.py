"""Rules about starting the processes and their group: --local_rank, set_device, NCCL, collectives."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..nodes import callee_name, is_const, keyword
from ..ranks import mentions_a_rank, singles_out_one_rank
from ..script import Script


def _flags(call: ast.Call) -> list[str]:
    return [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def local_rank_arg(script: Script) -> Iterator[tuple]:
    declared = [c for c in script.calls if callee_name(c) == "add_argument"]
    underscored = [c for c in declared if "--local_rank" in _flags(c)]
    if not underscored or any("--local-rank" in _flags(c) for c in declared):
        return
    if script.has_concept("spawn"):
        return  # the script starts its own processes and passes the rank itself; nobody sends the flag
    strict = any(callee_name(c) == "parse_args" for c in script.calls) or not any(
        callee_name(c) == "parse_known_args" for c in script.calls)
    for call in underscored:
        default = keyword(call, "default")
        value = script.text(default) if default is not None else "None"
        if strict:
            message = ("argparse declares only --local_rank: `python -m torch.distributed.launch` on torch >= 2.0 "
                       "passes --local-rank=N and the script dies with \"unrecognized arguments: --local-rank=0\"; "
                       f"torchrun passes neither, so args.local_rank stays {value} on every process")
        else:
            message = ("argparse declares only --local_rank: `python -m torch.distributed.launch` on torch >= 2.0 "
                       "passes --local-rank=N, which parse_known_args leaves unparsed, and torchrun passes neither: "
                       f"args.local_rank stays {value} on every process")
        yield (call,
               message,
               "declare both spellings and default to the launcher's variable: parser.add_argument('--local-rank', "
               "'--local_rank', type=int, default=int(os.environ.get('LOCAL_RANK', 0))); `ringtrain run` passes "
               "the spelling a script declares, and rt.Ring() reads LOCAL_RANK itself")


def _is_nccl(expr: ast.AST | None) -> bool:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value.lower() == "nccl"
    return isinstance(expr, ast.Attribute) and expr.attr == "NCCL"


def nccl_inits(script: Script, certain: bool = False) -> list[ast.Call]:
    """init_process_group calls whose backend is (``certain``: always) NCCL."""
    found = []
    for call in script.concept_calls.get("init_process_group", []):
        backend = keyword(call, "backend", 0)
        if backend is None:
            continue
        origins = script.origins(backend)
        if (all if certain else any)(_is_nccl(o) for o in origins):
            found.append(call)
    return found


def _pins_a_device(script: Script) -> bool:
    if script.has_concept("set_device"):
        return True
    for call in script.calls:
        if callee_name(call) in ("set_device", "set_device_index"):  # through an alias we cannot resolve
            return True
    for node in script.nodes:
        # os.environ["CUDA_VISIBLE_DEVICES"] = str(local_rank): each process sees only its GPU
        if isinstance(node, ast.Assign) and not isinstance(node.value, ast.Constant):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and is_const(t.slice, "CUDA_VISIBLE_DEVICES"):
                    return True
    return False


def set_device(script: Script) -> Iterator[tuple]:
    if not script.uses_cuda() or _pins_a_device(script):
        return
    starts = [c for c in nccl_inits(script) if keyword(c, "device_id") is None]
    horovod = script.concept_calls.get("hvd.init", [])
    for call in starts[:1] or horovod[:1]:
        what = "an NCCL process group" if call in starts else "Horovod"
        yield (call,
               f"{what} in a CUDA script that never calls torch.cuda.set_device: every process's current "
               "device stays cuda:0, so tensors made with .cuda() or device='cuda', and object collectives "
               "(all_gather_object, broadcast_object_list), are on GPU 0 in every process (memory piles up "
               "there, or NCCL fails with \"Duplicate GPU detected\")",
               "pin each process to its GPU first: torch.cuda.set_device(local_rank) (Horovod: "
               "torch.cuda.set_device(hvd.local_rank())), or init_process_group(..., device_id=torch.device('cuda', "
               "local_rank)); rt.Ring() pins each process to its GPU")


def _to_device_index(script: Script) -> bool:
    """``x.to(local_rank)``, ``model.cuda(gpu)``: an integer device is a CUDA device."""
    for call in script.calls:
        if callee_name(call) in ("to", "cuda") and isinstance(call.func, ast.Attribute) and call.args:
            target = call.args[0]
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if "rank" in name.lower() or "gpu" in name.lower():
                return True
    return False


def nccl_without_cuda(script: Script) -> Iterator[tuple]:
    if script.uses_cuda() or _to_device_index(script):
        return
    communicates = script.has_concept("DDP") or any(c.startswith("collective.") and calls
                                                   for c, calls in script.concept_calls.items())
    if not communicates:
        return
    for call in nccl_inits(script, certain=True)[:1]:
        yield (call,
               "backend='nccl' in a script that never puts its model or tensors on a GPU: NCCL only "
               "communicates CUDA tensors, so DDP's first broadcast or the first collective on a CPU tensor fails "
               "(and on a machine without GPUs, init_process_group does)",
               "use backend='gloo' for CPU training, or move the model and tensors to cuda:local_rank; "
               "rt.Ring() picks NCCL with GPUs and Gloo without")


def collective_on_one_rank(script: Script) -> Iterator[tuple]:
    for concept, calls in script.concept_calls.items():
        if not concept.startswith("collective."):
            continue
        if any(keyword(c, "group") is not None or keyword(c, "process_set") is not None for c in calls):
            continue  # subgroups: `if rank in group_ranks:` is how they are meant to be called
        guards = [_one_sided(script, c, concept) for c in calls]
        # A call site every rank runs (no rank check on its way) cannot pair with a one-rank one: rank 0 runs it
        # too, so it stays one call ahead of the others (nanoGPT's `if ddp: dist.all_reduce(loss)` beside one
        # under `if ... and master_process:`). Another call site under some rank check may be the pairing one.
        unpaired = [bool(g) or script.guarded(c, mentions_a_rank) is False for c, g in zip(calls, guards)]
        if not any(guards) or not all(unpaired):
            continue
        for call, guard in zip(calls, guards):
            if not guard:
                continue
            op = concept.split(".")[-1]
            yield (call,
                   f"{op} is a collective, but it runs only on the process(es) selected by the rank check at "
                   f"line {guard}: the other ranks never call it, and the job hangs until the timeout",
                   f"call {op} on every rank (outside the `if`) and keep only the printing or saving under the "
                   "rank check; ringtrain's ring.all_reduce/all_gather run on every rank and ring.print prints "
                   "on the main one")


def _one_sided(script: Script, node: ast.AST, concept: str, depth: int = 3) -> int:
    """The line of a rank check that keeps ``node`` from running on every rank (0 if none)."""
    for branch, in_body in script.branches_around(node):
        if isinstance(branch, ast.If) and singles_out_one_rank(branch.test):
            other = branch.orelse if in_body else branch.body
            paired = any(script.names.concept(c) == concept for stmt in other for c in script.calls_in(stmt, 1))
            return 0 if paired else branch.lineno
    fn = script.function_of(node)
    if fn is script.tree or depth == 0:
        return 0
    callers = script.callers(fn)
    if not callers:
        return 0
    lines = [_one_sided(script, c, concept, depth - 1) for c in callers]
    return lines[0] if all(lines) else 0


def _names_the_local_rank(expr: ast.AST) -> bool:
    """``local_rank`` or ``args.local_rank`` itself (an expression of it, e.g. node * n + local_rank, is fine)."""
    name = expr.id if isinstance(expr, ast.Name) else expr.attr if isinstance(expr, ast.Attribute) else None
    return name in ("local_rank", "localrank")


def rank_from_local_rank(script: Script) -> Iterator[tuple]:
    if script.has_concept("spawn"):
        return  # mp.spawn's index on one machine: the local rank is the rank there
    for call in script.concept_calls.get("init_process_group", []):
        rank = keyword(call, "rank")
        if rank is not None and _names_the_local_rank(rank):
            yield (call,
                   f"possible: init_process_group(rank={script.text(rank)}) takes the global rank from the local "
                   "one: right on one machine, but on two nodes both nodes' processes claim ranks 0..n-1 and the "
                   "group never forms",
                   "pass rank=int(os.environ['RANK']) (every launcher sets it), or leave rank= out with "
                   "init_method='env://'; rt.Ring() reads both itself")
