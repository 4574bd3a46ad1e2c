"""Collectives that move data without reducing it: allgather, broadcast, alltoall.

They send the tensor's bytes (``view(torch.uint8)``), so every dtype — including
those the engine rejects, like int16 on Gloo — arrives bit for bit. First
dimensions may differ per rank for allgather and alltoall (Horovod's contract);
the engine's equal-size collectives are fed padded rows and the padding is cut away.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import RingtrainError
from . import validate
from .checks import Call, Kind
from .groups import ProcessSet
from .handles import Handle
from .ops import all_gather_flat, byte_rows, row_bytes
from .validate import InvalidArgument


def _from_bytes(rows: torch.Tensor, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    if rows.numel() == 0:
        return torch.empty(shape, dtype=dtype, device=rows.device)
    return rows.contiguous().view(dtype).reshape(shape)


def _counts(tensor: torch.Tensor, ps: ProcessSet, rows) -> list[int]:
    """Every member's first dimension: from the check's rows, or one small all_gather."""
    if rows is not None:
        return [row.aux for row in rows]  # the check carried each member's first dimension
    mine = torch.tensor([tensor.shape[0]], dtype=torch.int64)
    everyone = torch.empty(ps.size(), dtype=torch.int64)
    all_gather_flat(everyone, mine, group=ps.group_for(None))
    return everyone.tolist()


def allgather(tensor: torch.Tensor, *, process_set: ProcessSet, check: bool = True, name: str | None = None) -> Handle:
    """Concatenate every member's ``tensor`` along dim 0, in rank order (first dims may differ)."""
    what = "allgather" + (f" {name!r}" if name else "")
    process_set.require_member(what)
    t = tensor.detach().contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    rest = tuple(t.shape[1:])
    call = Call(Kind.ALLGATHER, t.dtype, t.device.type, shape=tuple(t.shape), agree=f"{rest}", aux=t.shape[0], name=name)
    rows = validate.run(process_set, call, check)
    n = process_set.size()
    if n == 1:
        return Handle.completed(t.clone(), what=what)
    counts = _counts(t, process_set, rows)
    largest, width = max(counts), row_bytes(t)
    out_shape = (sum(counts), *rest)
    if largest == 0 or width == 0:
        return Handle.completed(torch.empty(out_shape, dtype=t.dtype, device=t.device), what=what)
    source = byte_rows(t)
    if t.shape[0] < largest:
        source = torch.cat([source, source.new_zeros((largest - t.shape[0], width))])
    gathered = torch.empty((n * largest, width), dtype=torch.uint8, device=t.device)
    work = all_gather_flat(gathered, source, group=process_set.group_for(t), async_op=True)

    def finish():
        if all(c == largest for c in counts):
            return _from_bytes(gathered, t.dtype, out_shape)
        pieces = [gathered[i * largest:i * largest + c] for i, c in enumerate(counts)]
        return _from_bytes(torch.cat(pieces), t.dtype, out_shape)

    return Handle([work], finish, what=what)


def gather_to(tensor: torch.Tensor, dst: int, *, process_set: ProcessSet, check: bool = True) -> Handle:
    """Every member's ``tensor`` along dim 0 in rank order on global rank ``dst`` (first dims may
    differ); None on the other ranks."""
    what = "gather"
    process_set.require_member(what)
    problem = validate.root_problem(dst, process_set, what)
    t = tensor.detach().contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    rest = tuple(t.shape[1:])
    call = Call(Kind.GATHER, t.dtype, t.device.type, root=dst if problem is None else -1, shape=tuple(t.shape),
                agree=f"{rest}", aux=t.shape[0])
    rows = validate.run(process_set, call, check, problem)
    n, mine = process_set.size(), process_set.rank() == process_set.ranks.index(dst)
    if n == 1:
        return Handle.completed(t.clone(), what=what)
    counts = _counts(t, process_set, rows)
    largest, width = max(counts), row_bytes(t)
    source = byte_rows(t)
    if t.shape[0] < largest:
        source = torch.cat([source, source.new_zeros((largest - t.shape[0], width))])
    buffers = [torch.empty((largest, width), dtype=torch.uint8, device=t.device) for _ in range(n)] if mine else None
    work = dist.gather(source, buffers, dst=dst, group=process_set.group_for(t), async_op=True)

    def finish():
        if not mine:
            return None
        pieces = torch.cat([buf[:c] for buf, c in zip(buffers, counts)])
        return _from_bytes(pieces, t.dtype, (sum(counts), *rest))

    return Handle([work], finish, what=what)


def grouped_allgather(tensors, *, process_set: ProcessSet, check: bool = True, name: str | None = None) -> Handle:
    handles = [allgather(t, process_set=process_set, check=check, name=name) for t in tensors]
    return Handle(handles, lambda: [h.wait() for h in handles], what="grouped allgather")


def broadcast(tensor: torch.Tensor, root_rank: int, *, process_set: ProcessSet, inplace: bool = False,
              check: bool = True, name: str | None = None, layout: str = "") -> Handle:
    """Rank ``root_rank``'s (a global rank) ``tensor`` on every member; in place or into a new tensor.

    ``layout``: anything else the check must find equal on every rank (fused broadcasts
    pass the shapes of the tensors they carry).
    """
    what = "broadcast" + (f" {name!r}" if name else "")
    process_set.require_member(what)
    problem = None
    if not isinstance(root_rank, int) or root_rank not in process_set.ranks:
        problem = RingtrainError(
            f"broadcast got root_rank={root_rank!r}, which is not a rank of {process_set!r} "
            f"(ranks {process_set.ranks})",
            "pass the global rank of a member of the process set as root_rank.",
        )
    call = Call(Kind.BROADCAST, tensor.dtype, tensor.device.type, root=root_rank if problem is None else -1,
                shape=tuple(tensor.shape), agree=f"{tuple(tensor.shape)} {layout}", name=name)
    validate.run(process_set, call, check, problem)
    target = tensor if inplace else tensor.detach().clone(memory_format=torch.contiguous_format)
    if process_set.size() == 1 or tensor.numel() == 0:
        return Handle.completed(target, what=what)
    buffer = target.detach() if target.is_contiguous() else target.detach().contiguous()
    work = dist.broadcast(buffer.reshape(-1).view(torch.uint8), src=root_rank,
                          group=process_set.group_for(buffer), async_op=True)

    def finish():
        if buffer.data_ptr() != target.data_ptr():
            with torch.no_grad():
                target.copy_(buffer)
        return target

    return Handle([work], finish, what=what)


def alltoall(tensor: torch.Tensor, splits=None, *, process_set: ProcessSet, check: bool = True,
             name: str | None = None) -> Handle:
    """Send ``splits[i]`` rows to member i, receive theirs; result ``(tensor, received_splits)``.

    Without ``splits`` the first dimension is divided equally (it must divide evenly).
    """
    what = "alltoall" + (f" {name!r}" if name else "")
    process_set.require_member(what)
    n = process_set.size()
    t = tensor.detach().contiguous()
    send, problem = _splits(t, splits, n)
    call = Call(Kind.ALLTOALL, t.dtype, t.device.type, shape=tuple(t.shape), agree=f"{tuple(t.shape[1:])}", name=name)
    validate.run(process_set, call, check, problem)
    rest = tuple(t.shape[1:])
    if n == 1:
        return Handle.completed((t[:sum(send)].clone(), torch.tensor(send, dtype=torch.int32)), what=what)
    group = process_set.group_for(t)
    sent = torch.tensor(send, dtype=torch.int64)
    received = torch.empty(n, dtype=torch.int64)
    dist.all_to_all_single(received, sent, group=process_set.group_for(None))
    recv = received.tolist()
    width = row_bytes(t)
    out = torch.empty((sum(recv), width), dtype=torch.uint8, device=t.device)
    works = []
    if width:  # the same decision on every rank (trailing dims were checked), or ranks would part ways
        source = byte_rows(t)[:sum(send)]  # Horovod leaves rows past the splits' sum unsent
        works.append(dist.all_to_all_single(out, source, output_split_sizes=recv, input_split_sizes=send,
                                            group=group, async_op=True))

    def finish():
        return _from_bytes(out, t.dtype, (sum(recv), *rest)), torch.tensor(recv, dtype=torch.int32)

    return Handle(works, finish, what=what)


def _splits(t: torch.Tensor, splits, n: int) -> tuple[list[int], RingtrainError | None]:
    """Horovod's rules (horovod/common/operations.cc, EnqueueTensorAlltoall): splits are 32-bit
    integers, one per member, adding up to at most the first dimension (rows past the sum are not
    sent); without splits the first dimension must divide evenly. Violations are ValueErrors."""
    if t.dim() == 0:
        return [0] * n, InvalidArgument("alltoall got a 0-d tensor", "pass a tensor with at least one dimension.")
    rows = t.shape[0]
    if splits is None:
        if rows % n:
            return [0] * n, InvalidArgument(
                f"alltoall without splits divides the first dimension equally, but {rows} rows do not "
                f"divide among {n} ranks",
                "pass splits=[rows for rank 0, rows for rank 1, ...] adding up to the first dimension.",
            )
        return [rows // n] * n, None
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1:
            return [0] * n, InvalidArgument(f"alltoall got a {splits.dim()}-d splits tensor",
                                            "pass a 1-d tensor (or a list) of row counts, one per rank.")
        if splits.dtype != torch.int32:
            return [0] * n, InvalidArgument(
                f"alltoall got splits of dtype {str(splits.dtype).replace('torch.', '')}; they must be 32-bit "
                "integers (as in Horovod)",
                "pass torch.tensor(splits, dtype=torch.int32), or a plain list of ints.",
            )
        values = [int(v) for v in splits.tolist()]
    else:
        values = [int(v) for v in splits]
    if len(values) != n:
        return [0] * n, InvalidArgument(
            f"alltoall got {len(values)} splits for {n} ranks",
            f"give one row count per rank of the process set ({n}).",
        )
    if any(v < 0 for v in values) or sum(values) > rows:
        return [0] * n, InvalidArgument(
            f"alltoall got splits={values} for a tensor with {rows} rows; the splits add up to more rows "
            "than there are, or one is negative",
            f"give {n} non-negative counts adding up to at most the first dimension ({rows}).",
        )
    return values, None
