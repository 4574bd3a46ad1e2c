"""Ring's collectives: ops named by strings, over the one collectives core (comm/).

``ring.all_reduce(loss, op="mean")`` and friends are a thin layer over ``ringtrain.comm``, the
core the Horovod API and the hvd strategy use too: what is added here is what a training
script expects of them —

* ops as strings (``"sum"``, ``"mean"``, ``"max"``, ``"min"``, ``"product"``), and a mean of
  integers that is float64 at any world size (one process included);
* Python numbers accepted (a CPU tensor; the default group carries Gloo beside NCCL);
* the identity on one process, so the same loop runs unchanged;
* ``reduce``/``gather`` to one rank (``None`` elsewhere), uneven first dimensions for the
  gathers (the last batch of an exact evaluation loader).

Each ring has a process set of its own (every rank of the default group), so its debug
checks (``Ring(debug_collectives=...)``: the store-based checker, comm/store_check.py, which
names a rank that calls something else or never arrives) neither see nor disturb the Horovod
API's. Off by default: a ring's own collectives are unchecked, as torch's are.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.distributed as dist

from .. import comm
from ..comm.store_check import StoreRows
from ..errors import RingtrainError
from ..liveness.activity import Activity

OPS = {
    "sum": comm.ReduceOp.SUM,
    "mean": comm.ReduceOp.AVERAGE,
    "max": comm.ReduceOp.MAX,
    "min": comm.ReduceOp.MIN,
    "product": comm.ReduceOp.PRODUCT,
}


def _describe(t: torch.Tensor, skip_first: bool = False) -> str:
    shape = list(t.shape[1:]) if skip_first else list(t.shape)
    return f"{str(t.dtype).replace('torch.', '')}{shape}" + (" (any first dim)" if skip_first else "")


def _as_tensor(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.tensor(x)


class Collectives:
    """The collectives of one ring (identity on one process)."""

    def __init__(self) -> None:
        self.process_set = comm.ProcessSet(None)
        self.check = False
        self.activity = Activity()  # the ring's, once its strategy is attached: where its collectives are marked

    def enable_checks(self, store: dist.Store, timeout: float) -> StoreRows:
        """Check every collective first, through ``store`` (debug mode); returns the checker."""
        checker = StoreRows(store, timeout, prefix="ring-check")
        self.process_set.checker, self.check = checker, True
        return checker

    @contextlib.contextmanager
    def _calling(self, text: str) -> Iterator[None]:
        checker = self.process_set.checker
        try:
            with self.activity.calling(text), (checker.describing(text) if checker else contextlib.nullcontext()):
                yield
        except RingtrainError:
            raise
        except RuntimeError as e:  # the engine failed before a handle was made (DistBackendError and friends)
            raise comm.handles._failure(text, e) from e

    def _op(self, op: str, what: str) -> comm.ReduceOp:
        if op not in OPS:
            raise RingtrainError(f"{what} got op={op!r}", f"use one of {sorted(OPS)}.")
        return OPS[op]

    def _reducible(self, x: Any, op: str) -> torch.Tensor:
        tensor = _as_tensor(x).detach()
        # A mean of integers is a float64, on one process as on many (the same script, the same dtype).
        return tensor.double() if op == "mean" and not tensor.is_floating_point() else tensor

    def all_reduce(self, x: Any, op: str = "mean") -> torch.Tensor:
        """Reduce ``x`` over all ranks and return the result (the input is not modified)."""
        engine_op, tensor = self._op(op, "all_reduce"), self._reducible(x, op)
        with self._calling(f"all_reduce(op={op}, {_describe(tensor)})"):
            return comm.allreduce(tensor, engine_op, process_set=self.process_set, check=self.check).wait()

    def reduce(self, x: Any, dst: int = 0, op: str = "mean") -> torch.Tensor | None:
        """Reduce ``x`` over all ranks onto rank ``dst``: the result there, None on the other ranks."""
        engine_op, tensor = self._op(op, "reduce"), self._reducible(x, op)
        with self._calling(f"reduce(dst={dst}, op={op}, {_describe(tensor)})"):
            return comm.reduce_to(tensor, dst, engine_op, process_set=self.process_set, check=self.check).wait()

    def all_gather(self, x: Any) -> torch.Tensor:
        """Every rank's ``x`` concatenated along dim 0 in rank order (first dimensions may differ;
        a 0-d tensor counts as one element)."""
        tensor = _as_tensor(x)
        with self._calling(f"all_gather({_describe(tensor, skip_first=True)})"):
            return comm.allgather(tensor, process_set=self.process_set, check=self.check).wait()

    def gather(self, x: Any, dst: int = 0) -> torch.Tensor | None:
        """``all_gather``, on rank ``dst`` only (None on the other ranks)."""
        tensor = _as_tensor(x)
        with self._calling(f"gather(dst={dst}, {_describe(tensor, skip_first=True)})"):
            return comm.gather_to(tensor, dst, process_set=self.process_set, check=self.check).wait()

    def gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        with self._calling("gather_object()"):
            return comm.allgather_object(obj, process_set=self.process_set, check=self.check)

    def broadcast(self, x: Any, src: int = 0) -> torch.Tensor:
        """Rank ``src``'s ``x`` on every rank (returned; a tensor given is updated in place too)."""
        tensor = _as_tensor(x)
        with self._calling(f"broadcast(src={src}, {_describe(tensor)})"):
            return comm.broadcast(tensor, src, process_set=self.process_set, inplace=True, check=self.check).wait()

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s picklable ``obj`` on every rank."""
        with self._calling(f"broadcast_object(src={src})"):
            return comm.broadcast_object(obj, src, process_set=self.process_set, check=self.check)

    def barrier(self) -> None:
        """Wait until every rank arrives."""
        with self._calling("barrier()"):
            comm.barrier(process_set=self.process_set, check=self.check, strict=True)
