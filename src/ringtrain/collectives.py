"""Collectives over the default process group, with the shapes users actually have.

Thin functions over ``torch.distributed``: the engine does the communication; what
is added here is what it lacks — op names as strings, ``mean``, and ``all_gather``
of tensors whose first dimension differs per rank (the last batch of an exact
evaluation loader). On one process every function is the identity, so the same
training loop runs unchanged.

A failing collective (a peer died, a timeout) becomes a ``RingtrainError`` that
names the call. With a ``Checker`` (``Ring(debug_collectives=True)``), every rank
first posts what it is about to call to the rendezvous store and waits for all
the others' posts: a rank that calls something else, or never arrives, is
named on every rank instead of hanging or returning garbage.
"""

from __future__ import annotations

import contextlib
import datetime
from typing import Any, Iterator

import torch
import torch.distributed as dist

from . import liveness
from .errors import RingtrainError

_PEER_HINT = (
    "the other rank's own error (in its output, or first in the launcher's report) is the cause; a rank "
    "that finished early means the ranks made different collective calls (a branch on the rank, uneven data)."
)
_DEBUG_HINT = (
    "a peer rank may have died, be stuck elsewhere, or have called a different collective; rerun with "
    "Ring(debug_collectives=True) (or RINGTRAIN_DEBUG_COLLECTIVES=1) to name the rank and its call."
)


class Checker:
    """Descriptor exchange through the job's store before each collective (debug mode).

    Every rank writes ``check/<n>/<rank>`` = what it is about to call, then waits
    up to ``timeout`` seconds for all ranks' keys of round n. The wait needs no
    collective of its own, so a missing rank cannot hang it, and every rank reads
    the same keys, so every rank raises the same error.
    """

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout: float):
        self.store, self.rank, self.world_size, self.timeout = store, rank, world_size, timeout
        self.round = 0

    def __call__(self, call: str) -> None:
        self.round += 1
        n = self.round
        keys = [f"check/{n}/{r}" for r in range(self.world_size)]
        self.store.set(keys[self.rank], call)
        try:
            self.store.wait(keys, datetime.timedelta(seconds=self.timeout))
        except (RuntimeError, TimeoutError) as e:  # DistStoreError is a RuntimeError
            arrived = {r: self.store.get(k).decode() for r, k in enumerate(keys) if self.store.check([k])}
            missing = [r for r in range(self.world_size) if r not in arrived]
            raise RingtrainError(
                f"collective #{n}: rank(s) {missing} never arrived within {self.timeout:g}s; "
                + "; ".join(f"rank {r} called {c}" for r, c in sorted(arrived.items())),
                "the missing rank(s) skipped this collective (a branch on rank, an early return or "
                "break) or are stuck or dead: every rank must make the same collective calls in the same order.",
            ) from e
        calls = [self.store.get(k).decode() for k in keys]
        if len(set(calls)) > 1:
            raise RingtrainError(
                f"collective #{n} differs across ranks: " + "; ".join(f"rank {r} called {c}" for r, c in enumerate(calls)),
                "every rank must call the same collective with the same dtype and shape (all_gather: same "
                "trailing dimensions) in the same order.",
            )
        if n > 2:
            # Every rank has posted round n, so all have finished reading round n-2.
            with contextlib.suppress(RuntimeError):
                self.store.delete_key(f"check/{n - 2}/{self.rank}")


@contextlib.contextmanager
def _named(call: str, check: Checker | None) -> Iterator[None]:
    if check is not None:
        check(call)
    try:
        with liveness.ACTIVITY.calling(call):
            yield
    except RuntimeError as e:  # DistBackendError and friends
        why = liveness.explain()  # a peer that failed or left first, if the board knows one
        if why is not None:
            raise RingtrainError(f"{call} on rank {dist.get_rank()} failed because {why}", _PEER_HINT) from e
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise RingtrainError(f"{call} failed on rank {dist.get_rank()}: {first}", _DEBUG_HINT) from e


def _describe(t: torch.Tensor, skip_first: bool = False) -> str:
    shape = list(t.shape[1:]) if skip_first else list(t.shape)
    return f"{str(t.dtype).replace('torch.', '')}{shape}" + (" (any first dim)" if skip_first else "")

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,  # divided afterwards: Gloo has no AVG
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
}


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _as_tensor(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.tensor(x)


def _reduced_copy(x: Any, op: str, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the input as a tensor, the buffer a reduction writes): a mean of integers is float64 at
    any world size, so a script gets the same dtype on one process as on many."""
    if op not in _OPS:
        raise RingtrainError(f"{what} got op={op!r}", f"use one of {sorted(_OPS)}.")
    tensor = _as_tensor(x)
    out = tensor.detach().clone()
    if op == "mean" and not out.is_floating_point():
        out = out.double()
    return tensor, out


def all_reduce(x: Any, op: str = "mean", check: Checker | None = None) -> torch.Tensor:
    """Reduce ``x`` over all ranks and return the result (the input is not modified)."""
    tensor, out = _reduced_copy(x, op, "all_reduce")
    if not _active():
        return out
    with _named(f"all_reduce(op={op}, {_describe(tensor)})", check):
        dist.all_reduce(out, op=_OPS[op])
    if op == "mean":
        out /= dist.get_world_size()
    return out


def reduce(x: Any, dst: int = 0, op: str = "mean", check: Checker | None = None) -> torch.Tensor | None:
    """Reduce ``x`` over all ranks onto rank ``dst``: the result there, None on the other ranks."""
    tensor, out = _reduced_copy(x, op, "reduce")
    if not _active():
        return out
    _check_rank(dst, "reduce", "dst")
    with _named(f"reduce(dst={dst}, op={op}, {_describe(tensor)})", check):
        dist.reduce(out, dst=dst, op=_OPS[op])
    if dist.get_rank() != dst:
        return None
    if op == "mean":
        out /= dist.get_world_size()
    return out


def _check_rank(rank: Any, what: str, name: str) -> None:
    world = dist.get_world_size()
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise RingtrainError(f"{what} got {name}={rank!r} in a job of {world} ranks",
                             f"{name} is a rank, 0 to {world - 1}, the same on every rank.")


def all_gather(x: Any, check: Checker | None = None) -> torch.Tensor:
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
    with _named(f"all_gather({_describe(tensor, skip_first=True)})", check):
        dist.all_gather(sizes, local_size)
    sizes_list = [int(s.item()) for s in sizes]
    padded = _padded(tensor, max(sizes_list))
    buffers = [torch.empty_like(padded) for _ in range(world)]
    with _named("all_gather (data)", None):
        dist.all_gather(buffers, padded)
    return torch.cat([buf[:n] for buf, n in zip(buffers, sizes_list)])


def gather(x: Any, dst: int = 0, check: Checker | None = None) -> torch.Tensor | None:
    """Every rank's ``x`` concatenated along dim 0 in rank order on rank ``dst`` (first dimensions may
    differ, as for ``all_gather``); None on the other ranks."""
    tensor = _as_tensor(x)
    if tensor.dim() == 0:
        tensor = tensor.reshape(1)
    if not _active():
        return tensor
    _check_rank(dst, "gather", "dst")
    sizes = all_gather(torch.tensor([tensor.shape[0]], dtype=torch.long, device=tensor.device), check).tolist()
    padded = _padded(tensor, max(sizes))
    buffers = [torch.empty_like(padded) for _ in sizes] if dist.get_rank() == dst else None
    with _named(f"gather(dst={dst}, {_describe(tensor, skip_first=True)})", None):
        dist.gather(padded, buffers, dst=dst)
    if buffers is None:
        return None
    return torch.cat([buf[:n] for buf, n in zip(buffers, sizes)])


def _padded(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    if tensor.shape[0] >= rows:
        return tensor.contiguous()
    pad = torch.zeros((rows - tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    return torch.cat([tensor, pad])


def gather_object(obj: Any, check: Checker | None = None) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    with _named("gather_object()", check):
        dist.all_gather_object(out, obj)
    return out


def broadcast(x: Any, src: int = 0, check: Checker | None = None) -> torch.Tensor:
    """Rank ``src``'s ``x`` on every rank (returned; the input is updated in place too)."""
    tensor = _as_tensor(x)
    if not _active():
        return tensor
    with _named(f"broadcast(src={src}, {_describe(tensor)})", check):
        dist.broadcast(tensor, src=src)
    return tensor


def broadcast_object(obj: Any, src: int = 0, check: Checker | None = None) -> Any:
    """Rank ``src``'s picklable ``obj`` on every rank."""
    if not _active():
        return obj
    box = [obj]
    with _named(f"broadcast_object(src={src})", check):
        dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier(check: Checker | None = None) -> None:
    """Wait until every rank arrives."""
    if _active():
        with _named("barrier()", check):
            dist.barrier()
