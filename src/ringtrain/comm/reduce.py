"""Reductions: allreduce (one tensor or a group, fused), and reducescatter.

Each returns a :class:`Handle`. Semantics follow Horovod's documented API:
``prescale`` multiplies before the reduction, ``postscale`` after, Average divides
by the number of ranks in the process set; in-place forms write into the input.
A grouped allreduce packs tensors of one dtype and device into one flat buffer,
so N small tensors cost one engine call (Horovod's tensor fusion).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import RingtrainError
from . import adasum, validate
from .checks import Call, Kind
from .groups import ProcessSet
from .handles import Handle
from .ops import ReduceOp, as_op, finish_, reduce_scatter_flat, scale_, wire


def _device(t: torch.Tensor) -> str:
    return t.device.type


def allreduce(tensor: torch.Tensor, op=ReduceOp.AVERAGE, *, prescale: float = 1.0, postscale: float = 1.0,
              process_set: ProcessSet, inplace: bool = False, check: bool = True, name: str | None = None) -> Handle:
    """Reduce ``tensor`` over the process set; the handle's result has its shape and dtype."""
    handle = grouped_allreduce([tensor], op, prescale=prescale, postscale=postscale, process_set=process_set,
                               inplace=inplace, check=check, name=name)
    return Handle([handle], lambda: handle.wait()[0], what=handle.what)


def grouped_allreduce(tensors, op=ReduceOp.AVERAGE, *, prescale: float = 1.0, postscale: float = 1.0,
                      process_set: ProcessSet, inplace: bool = False, check: bool = True,
                      name: str | None = None) -> Handle:
    """Reduce every tensor of ``tensors``; tensors sharing dtype and device travel in one buffer."""
    op = as_op(op)
    tensors = list(tensors)
    what = f"allreduce{'' if len(tensors) == 1 else ' (grouped)'}" + (f" {name!r}" if name else "")
    process_set.require_member(what)
    outputs = [t if inplace else torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    if op == ReduceOp.ADASUM:
        return _adasum(tensors, outputs, prescale, postscale, process_set, check, name)
    n = process_set.size()
    pending = []
    for key, members in _by_dtype_device(tensors).items():
        dtype = key[0]
        wire_dtype, engine_op = wire(dtype, op)
        shapes = [tuple(tensors[i].shape) for i in members]
        numel = sum(tensors[i].numel() for i in members)
        call = Call(Kind.ALLREDUCE, dtype, _device(tensors[members[0]]), int(op), shape=(numel,),
                    agree=f"{dtype} {shapes} {prescale!r} {postscale!r}", aux=numel, name=name)
        validate.run(process_set, call, check, allow_joined=True)
        flat = _pack([tensors[i] for i in members], wire_dtype)
        scale_(flat, prescale)
        work = None
        if n > 1 and numel:
            work = dist.all_reduce(flat, op=engine_op, group=process_set.group_for(flat), async_op=True)
        pending.append((members, flat, work))

    def finish():
        for members, flat, _ in pending:
            finish_(flat, op, postscale, n)
            _unpack(flat, [outputs[i] for i in members])
        return outputs

    return Handle([w for _, _, w in pending if w is not None], finish, what=what)


def reduce_to(tensor: torch.Tensor, dst: int, op=ReduceOp.AVERAGE, *, process_set: ProcessSet,
              check: bool = True) -> Handle:
    """Reduce ``tensor`` over the set onto global rank ``dst``: the result there, None elsewhere."""
    op = as_op(op)
    what = "reduce"
    process_set.require_member(what)
    problem = validate.root_problem(dst, process_set, what)
    if problem is None and op == ReduceOp.ADASUM:
        problem = RingtrainError("reduce does not support op=Adasum", "use op=Sum or Average.")
    wire_dtype, engine_op = wire(tensor.dtype, op) if problem is None else (tensor.dtype, None)
    call = Call(Kind.REDUCE, tensor.dtype, _device(tensor), int(op), root=dst if problem is None else -1,
                shape=tuple(tensor.shape), agree=f"{tuple(tensor.shape)}")
    validate.run(process_set, call, check, problem)
    flat = tensor.detach().reshape(-1).to(wire_dtype, copy=True)
    n, mine = process_set.size(), process_set.rank() == process_set.ranks.index(dst)
    works = []
    if n > 1 and flat.numel():
        works.append(dist.reduce(flat, dst=dst, op=engine_op, group=process_set.group_for(flat), async_op=True))

    def finish():
        if not mine:
            return None
        return finish_(flat, op, 1.0, n).to(tensor.dtype).reshape(tensor.shape)

    return Handle(works, finish, what=what)


def _by_dtype_device(tensors) -> dict:
    groups: dict = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    return groups


def _pack(tensors, dtype: torch.dtype) -> torch.Tensor:
    if len(tensors) == 1:
        return tensors[0].detach().reshape(-1).to(dtype, copy=True)
    return torch.cat([t.detach().reshape(-1).to(dtype) for t in tensors])


def _unpack(flat: torch.Tensor, outputs) -> None:
    start = 0
    with torch.no_grad():
        for out in outputs:
            size = out.numel()
            out.copy_(flat[start:start + size].view(out.shape))
            start += size


def _adasum(tensors, outputs, prescale, postscale, ps: ProcessSet, check: bool, name) -> Handle:
    problem = adasum.check_size(ps)
    for t in tensors:
        problem = problem or adasum.check_dtype(t.dtype)
    keys = _by_dtype_device(tensors)
    for key, members in keys.items():
        shapes = [tuple(tensors[i].shape) for i in members]
        call = Call(Kind.ADASUM, key[0], _device(tensors[members[0]]), int(ReduceOp.ADASUM),
                    shape=(sum(tensors[i].numel() for i in members),), agree=f"{shapes} {prescale!r} {postscale!r}")
        validate.run(ps, call, check, problem)  # raises on every rank when any rank's call is invalid
        work = [tensors[i].detach().to(torch.float32 if tensors[i].element_size() < 4 else tensors[i].dtype,
                                       copy=True) for i in members]
        for w in work:
            scale_(w, prescale)
        adasum.adasum_(work, ps)
        with torch.no_grad():
            for i, w in zip(members, work):
                outputs[i].copy_(scale_(w, postscale).to(outputs[i].dtype))
    return Handle.completed(outputs, what="allreduce (Adasum)")


def split_rows(rows: int, n: int) -> list[int]:
    """Horovod's reducescatter split: the first ``rows % n`` ranks get one extra row
    (horovod/common/ops/collective_operations.cc, ``ComputeOutputShapeForRank``)."""
    return [rows // n + (1 if r < rows % n else 0) for r in range(n)]


def reducescatter(tensor: torch.Tensor, op=ReduceOp.AVERAGE, *, prescale: float = 1.0, postscale: float = 1.0,
                  process_set: ProcessSet, check: bool = True, name: str | None = None) -> Handle:
    """Reduce ``tensor`` over the set and give each rank its block of rows (Horovod's uneven split)."""
    op = as_op(op)
    what = "reducescatter" + (f" {name!r}" if name else "")
    process_set.require_member(what)
    problem = None
    if op == ReduceOp.ADASUM:
        problem = RingtrainError("reducescatter does not support op=Adasum", "use op=Sum or Average.")
    elif tensor.dim() == 0:
        problem = RingtrainError("reducescatter got a 0-d tensor; it splits the first dimension",
                                 "pass a tensor with at least one dimension.")
    wire_dtype, engine_op = wire(tensor.dtype, op) if problem is None else (tensor.dtype, None)
    call = Call(Kind.REDUCESCATTER, tensor.dtype, _device(tensor), int(op), shape=tuple(tensor.shape),
                agree=f"{tuple(tensor.shape)} {prescale!r} {postscale!r}", name=name)
    validate.run(process_set, call, check, problem)
    n, me = process_set.size(), process_set.rank()
    counts = split_rows(tensor.shape[0], n)
    rest = tuple(tensor.shape[1:])
    chunk = max(counts)
    width = 1
    for d in rest:
        width *= d
    source = tensor.detach().reshape(tensor.shape[0], width)
    if tensor.shape[0] % n == 0:
        padded = source.to(wire_dtype, copy=True).reshape(n, chunk, width)
    else:
        padded = torch.zeros((n, chunk, width), dtype=wire_dtype, device=tensor.device)
        start = 0
        for r, count in enumerate(counts):
            padded[r, :count] = source[start:start + count]
            start += count
    scale_(padded, prescale)
    out = torch.empty((chunk, width), dtype=wire_dtype, device=tensor.device)
    works = []
    if n > 1 and out.numel():
        works.append(reduce_scatter_flat(out.reshape(-1), padded.reshape(-1), op=engine_op,
                                     group=process_set.group_for(out), async_op=True))
    elif n == 1:
        out = padded[0]

    def finish():
        mine = finish_(out[:counts[me]].clone(), op, postscale, n)
        return mine.to(tensor.dtype).reshape(counts[me], *rest)

    return Handle(works, finish, what=what)


def grouped_reducescatter(tensors, op=ReduceOp.AVERAGE, *, prescale: float = 1.0, postscale: float = 1.0,
                          process_set: ProcessSet, check: bool = True, name: str | None = None) -> Handle:
    handles = [reducescatter(t, op, prescale=prescale, postscale=postscale, process_set=process_set,
                             check=check, name=name) for t in tensors]
    return Handle(handles, lambda: [h.wait() for h in handles], what="grouped reducescatter")
