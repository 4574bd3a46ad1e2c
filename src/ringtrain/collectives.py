"""Collectives over the default process group, with the shapes users actually have.

Thin functions over ``torch.distributed``: the engine does the communication; what
is added here is what it lacks — op names as strings, ``mean``, and ``all_gather``
of tensors whose first dimension differs per rank (the last batch of an exact
evaluation loader). On one process every function is the identity, so the same
training loop runs unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .errors import RingtrainError

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,  # divided afterwards: Gloo has no AVG
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _as_tensor(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.tensor(x)


def all_reduce(x: Any, op: str = "mean") -> torch.Tensor:
    """Reduce ``x`` over all ranks and return the result (the input is not modified)."""
    if op not in _OPS:
        raise RingtrainError(
            f"all_reduce got op={op!r}",
            f"use one of {sorted(_OPS)}.",
        )
    tensor = _as_tensor(x)
    if not _active():
        return tensor
    out = tensor.detach().clone()
    if op == "mean" and not out.is_floating_point():
        out = out.double()
    dist.all_reduce(out, op=_OPS[op])
    if op == "mean":
        out /= dist.get_world_size()
    return out


def all_gather(x: Any) -> torch.Tensor:
    """Concatenate ``x`` from every rank along dim 0, in rank order.

    First dimensions may differ per rank (other dimensions must agree): sizes are
    exchanged first, every rank pads to the largest, and padding is cut away.
    A 0-d tensor is treated as a 1-element tensor.
    """
    tensor = _as_tensor(x)
    if tensor.dim() == 0:
        tensor = tensor.reshape(1)
    if not _active():
        return tensor
    world = dist.get_world_size()
    device = tensor.device
    local_size = torch.tensor([tensor.shape[0]], device=device, dtype=torch.long)
    sizes = [torch.zeros_like(local_size) for _ in range(world)]
    dist.all_gather(sizes, local_size)
    sizes_list = [int(s.item()) for s in sizes]
    largest = max(sizes_list)
    padded = tensor.contiguous()
    if tensor.shape[0] < largest:
        pad = torch.zeros((largest - tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=device)
        padded = torch.cat([tensor, pad])
    buffers = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(buffers, padded)
    return torch.cat([buf[:n] for buf, n in zip(buffers, sizes_list)])


def gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast(x: Any, src: int = 0) -> torch.Tensor:
    """Rank ``src``'s ``x`` on every rank (returned; the input is updated in place too)."""
    tensor = _as_tensor(x)
    if not _active():
        return tensor
    dist.broadcast(tensor, src=src)
    return tensor


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s picklable ``obj`` on every rank."""
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    """Wait until every rank arrives."""
    if _active():
        dist.barrier()
