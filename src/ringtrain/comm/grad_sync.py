"""Gradient synchronisation by hooks: buckets of gradients reduced while backward runs.

Each trainable parameter gets a hook on its gradient accumulator
(``register_post_accumulate_grad_hook``, torch >= 2.1): when its gradient is final
for this step (after ``backward_passes_per_step`` backward passes), it is copied
into its bucket; when a bucket is complete, one asynchronous allreduce starts for
the whole bucket. ``synchronize()`` starts what is left, waits for everything, and
writes the averaged gradients back into ``p.grad``.

Buckets (Horovod's tensor fusion, HOROVOD_FUSION_THRESHOLD) are fixed up front:
parameters in reverse definition order (the order backward usually produces their
gradients, as DDP assumes), split by dtype and device, cut when a bucket reaches
``fusion_threshold`` bytes (0 = one parameter per bucket, fusion off); the first
bucket is cut at 1 MiB already, so communication starts early in backward. Buckets are
launched strictly in order, so every rank issues the same engine calls in the same
order whatever order its hooks fire in (Horovod negotiates this through its
coordinator; DDP uses the same in-order rule).

Each bucket carries one flag per parameter — "this rank had a gradient" — reduced
with the payload: a parameter that got no gradient on any rank keeps ``grad=None``
(so optimizers skip it, as on one process); one that got a gradient on some ranks
only is averaged with zeros from the others, as DDP does.

With checks on, a layout is checked once (one blocking metadata check before its first
bucket, so a rank with a different model raises instead of reducing garbage), and again
only when the set last ran another layout — not every step: a per-step check is one more
engine round trip per step, 5-15 % of a small model's step on CPU. Buckets
travel on the process set's gradient group, apart from the check rounds, so a rank that
has called ``join()`` can keep zero buckets of the verified layout posted there while it
waits for check rounds (join.py); each bucket carries one more slot, 1 from every rank
that really stepped, so a joined rank tells a real step from the zeros other joined ranks
(or a flush) sent.
"""

from __future__ import annotations

import functools
import time
import weakref

import torch
import torch.distributed as dist

from ..errors import RingtrainError
from ..liveness.activity import waits_for_peers
from ..tracking import timeline
from . import validate
from .checks import Call, Kind, hash_text
from .compression import NoneCompressor
from .groups import ProcessSet
from .ops import ReduceOp, as_op, finish_, scale_, wire

DEFAULT_FUSION_THRESHOLD = 64 * 1024 * 1024  # Horovod's HOROVOD_FUSION_THRESHOLD default
# The first bucket (the last layers, whose gradients come first) is cut at 1 MiB so its
# reduction starts early in backward, overlapping the rest — DDP's first_bucket_bytes.
# Horovod gets the same effect from its cycle time (HOROVOD_CYCLE_TIME): whatever is ready
# every few milliseconds goes out, without waiting for a full fusion buffer.
FIRST_BUCKET_BYTES = 1024 * 1024
# id(param) -> (param, its GradientSync), both weak: a parameter is reduced by one sync at a time,
# whichever process set that sync runs on, so this one map is per process, not per set.
_OWNERS: dict[int, tuple[weakref.ref, weakref.ref]] = {}


class Layouts:
    """This rank's live gradient syncs on one process set, by layout hash (``ProcessSet.part``).

    A rank that has joined learns only the hash of the layout the others verified (join.py);
    it finds the wire spec of its own sync with that layout here. Weak: a sync that is gone
    no longer counts.
    """

    def __init__(self) -> None:
        self.live: "weakref.WeakValueDictionary[int, GradientSync]" = weakref.WeakValueDictionary()

    def clear(self) -> None:
        """Nothing to drop when the set is reset (``shutdown``): a sync that still lives keeps its
        hooks and its layout across ``shutdown()`` and ``init()``, as before."""

    def spec_of(self, layout_hash: int) -> list[tuple]:
        """The wire spec of this rank's gradient layout with that hash (a joined rank mirrors it)."""
        sync = self.live.get(layout_hash)
        if sync is None:
            raise RingtrainError(
                "this rank has joined, and the other ranks are synchronising gradients of a DistributedOptimizer "
                "that this rank does not have",
                "create the same DistributedOptimizer (same model) on every rank before any rank joins.",
            )
        return sync.wire_spec()


class _Bucket:
    def __init__(self, params: list[torch.Tensor]):
        self.params = params
        self.numels = [p.numel() for p in params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(params))]
        self.numel = sum(self.numels)
        self.dtype, self.device = params[0].dtype, params[0].device
        # payload, one "had a gradient" flag per parameter, one "a rank that really stepped" slot
        self.buffer = torch.zeros(self.numel + len(params) + 1, dtype=self.dtype, device=self.device)
        self.ready = 0
        self.pending = None  # (work, wire, ctx, payload numel, payload shape)
        self.event = None  # its all-reduce on a timeline (timeline.py), when one records

    @property
    def payload(self) -> torch.Tensor:
        return self.buffer[:self.numel]

    @property
    def flags(self) -> torch.Tensor:
        return self.buffer[self.numel:]

    def pack(self) -> None:
        """Copy every gradient into the buffer in one call (missing gradients as zeros, flag 0)."""
        pieces, flags = [], []
        for p, numel in zip(self.params, self.numels):
            grad = p.grad
            if grad is None:
                pieces.append(torch.zeros(numel, dtype=self.dtype, device=self.device))
                flags.append(0)
            else:
                pieces.append((grad.to_dense() if grad.is_sparse else grad).reshape(-1))
                flags.append(1)
        torch.cat(pieces, out=self.payload)
        if all(flags):
            self.flags.fill_(1)  # the common case, in a backward hook: no host-to-device copy
        else:
            self.flags.copy_(torch.tensor(flags + [1], dtype=self.dtype, device=self.device))

    def clear(self) -> None:
        self.ready = 0
        self.pending = None
        self.event = None


def plan_buckets(params: list[torch.Tensor], threshold: int, groups: list[list[torch.Tensor]] | None = None):
    """Split ``params`` into buckets: explicit ``groups`` first, the rest by size threshold."""
    buckets: list[list[torch.Tensor]] = []
    grouped = set()
    for group in groups or []:
        members = [p for p in group if any(p is q for q in params)]
        by_kind: dict = {}
        for p in members:
            by_kind.setdefault((p.dtype, p.device), []).append(p)
            grouped.add(id(p))
        buckets.extend(by_kind.values())
    open_buckets: dict = {}
    first = True
    for p in reversed(params):
        if id(p) in grouped:
            continue
        key = (p.dtype, p.device)
        if key not in open_buckets:
            open_buckets[key] = [[], 0, min(threshold, FIRST_BUCKET_BYTES) if first else threshold]
            first = False
            buckets.append(open_buckets[key][0])
        entry = open_buckets[key]
        entry[0].append(p)
        entry[1] += p.numel() * p.element_size()
        if entry[1] >= entry[2]:
            del open_buckets[key]
    return buckets


class GradientSync:
    """Reduce the gradients of ``params`` across ``process_set`` as backward produces them."""

    def __init__(self, params, *, process_set: ProcessSet, op=ReduceOp.AVERAGE, prescale: float = 1.0,
                 postscale: float = 1.0, compression=NoneCompressor, backward_passes_per_step: int = 1,
                 fusion_threshold: int = DEFAULT_FUSION_THRESHOLD, groups=None, check: bool = True):
        self.op = as_op(op)
        if self.op == ReduceOp.ADASUM:
            raise AssertionError("Adasum gradients go through the delta optimizer (optimizer.py)")
        _positive(backward_passes_per_step)
        unique: dict[int, torch.Tensor] = {}
        for p in params:
            if p.requires_grad:
                unique.setdefault(id(p), p)
        self.params = list(unique.values())
        self.process_set = process_set
        self.prescale, self.postscale = prescale, postscale
        self.compression = compression
        self.check = check
        self.backward_passes_per_step = backward_passes_per_step
        self.buckets = [_Bucket(b) for b in plan_buckets(self.params, int(fusion_threshold), groups) if b]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._delay = {id(p): backward_passes_per_step for p in self.params}
        self._next = 0
        self._started = False
        self.layout = (f"{self.op.name} {prescale!r} {postscale!r} {getattr(compression, '__name__', compression)} "
                       + "; ".join(f"{b.dtype} {[tuple(p.shape) for p in b.params]}" for b in self.buckets))
        self.layout_hash = hash_text(self.layout)
        self._hooks = []
        self.detached = False
        # Ranks outside the process set keep their gradients (Horovod: no hooks, synchronize() does nothing).
        self.member = process_set.included()
        if process_set.size() > 1 and self.member:
            process_set.part(Layouts).live[self.layout_hash] = self
            self._claim()
            self._hooks = [p.register_post_accumulate_grad_hook(functools.partial(self._on_grad, id(p)))
                           for p in self.params]

    def _claim(self) -> None:
        """Wrapping parameters again (a new optimizer after a restart, a new LR schedule ...) retires the
        previous sync of those parameters; otherwise both would reduce every gradient."""
        if len(_OWNERS) > 4 * len(self.params) + 4096:  # forget parameters that no longer exist
            for key in [k for k, (param, _) in _OWNERS.items() if param() is None]:
                del _OWNERS[key]
        for p in self.params:
            entry = _OWNERS.get(id(p))
            if entry is not None and entry[0]() is p:
                previous = entry[1]()
                if previous is not None and previous is not self:
                    previous.detach()
            _OWNERS[id(p)] = (weakref.ref(p), weakref.ref(self))

    def detach(self) -> None:
        self.remove()
        self.detached = True

    # --- during backward -----------------------------------------------------
    def _on_grad(self, pid: int, _param: torch.Tensor) -> None:
        left = self._delay[pid]
        if left <= 0:
            raise RingtrainError(
                f"gradients were computed more than backward_passes_per_step={self.backward_passes_per_step} "
                "times before optimizer.step()",
                "raise backward_passes_per_step to the number of backward passes you accumulate, or call "
                "optimizer.step() (or synchronize()) after that many.",
            )
        self._delay[pid] = left - 1
        if left == 1:  # this parameter's gradient is final for the step
            bucket = self._bucket_of[pid]
            bucket.ready += 1
            if bucket.ready == len(bucket.params):
                self._launch_in_order(force=False)

    def _launch_in_order(self, force: bool) -> None:
        while self._next < len(self.buckets):
            bucket = self.buckets[self._next]
            if not force and bucket.ready < len(bucket.params):
                return
            bucket.pack()  # forced: partial accumulations and missing gradients go as they are
            self._launch(bucket)
            self._next += 1

    def _layout_call(self) -> Call:
        return Call(Kind.GRAD_SYNC, self.buckets[0].dtype if self.buckets else None, "cpu", int(self.op),
                    shape=(sum(b.numel for b in self.buckets),), agree=self.layout, aux=len(self.buckets))

    def _wire(self, bucket: _Bucket):
        payload = bucket.payload
        compressed, ctx = self.compression.compress(payload)
        if compressed is payload:  # no compression: reduce the bucket's own buffer, flags included
            return bucket.buffer, ctx, compressed.numel(), compressed.shape
        flat = compressed.reshape(-1)
        return torch.cat([flat, bucket.flags.to(flat.dtype)]), ctx, flat.numel(), compressed.shape

    def _launch(self, bucket: _Bucket) -> None:
        ps = self.process_set
        if not self._started:
            self._started = True
            ps.grad_steps += 1
            if self.check and ps.size() > 1 and (ps.grad_layout is None or ps.grad_layout[0] != self.layout_hash):
                # Blocking, so a rank with another model raises before any bucket is reduced
                # (mismatched bucket sizes would hang the engine). Once per layout, not per step.
                rows = validate.run(ps, self._layout_call(), True, allow_joined=True)
                if ps.grad_layout is not None and any(row.kind == Kind.JOIN for row in rows):
                    flush(ps.grad_layout[1], ps)  # joined ranks hold zero buckets of the old layout
                ps.grad_layout = (self.layout_hash, self.wire_spec())
        recorder = ps.recorder
        started = time.time() if recorder is not None else 0.0
        buffer, ctx, size, shape = self._wire(bucket)
        scale_(buffer[:size], self.prescale)
        _, engine_op = wire(buffer.dtype, self.op)
        work = dist.all_reduce(buffer, op=engine_op, group=ps.grad_group_for(buffer), async_op=True)
        bucket.pending = (work, buffer, ctx, size, shape)
        if recorder is not None:  # a timeline: this bucket's all-reduce, from here to the work's completion
            bucket.event = recorder.bucket(self._next, bucket.numel * bucket.buffer.element_size(), started,
                                           getattr(self.compression, "__name__", "none"))
            work.get_future().add_done_callback(functools.partial(timeline.ended, bucket.event))

    def wire_spec(self) -> list[tuple]:
        """What each bucket's engine call moves: (numel, dtype, device, engine op) — what a joined
        rank posts zeros of."""
        spec = []
        for bucket in self.buckets:
            buffer, _, _, _ = self._wire(bucket)
            spec.append((buffer.numel(), buffer.dtype, buffer.device, wire(buffer.dtype, self.op)[1]))
        return spec

    # --- at step ----------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """True between the first gradient hook of a step and ``synchronize()``."""
        return any(left != self.backward_passes_per_step for left in self._delay.values())

    @waits_for_peers(lambda frame: "synchronize (gradient all-reduce)")
    def synchronize(self) -> None:
        """Reduce every bucket not yet reduced, wait for all, write results into ``p.grad``."""
        if self.detached:
            raise RingtrainError(
                "this DistributedOptimizer's parameters were wrapped again by a newer DistributedOptimizer, "
                "which now reduces their gradients",
                "step the newest DistributedOptimizer; the older one no longer synchronizes anything.",
            )
        if self.process_set.size() > 1 and self.buckets and self.member:
            self._launch_in_order(force=True)
            for bucket in self.buckets:
                self._complete(bucket)
        self._reset()

    def _complete(self, bucket: _Bucket) -> None:
        work, buffer, ctx, size, shape = bucket.pending
        work.wait()
        if bucket.event is not None:  # a timeline: done by now, if the completion callback has not said so yet
            timeline.ended(bucket.event)
        result = self.compression.decompress(buffer[:size].view(shape), ctx).reshape(-1)
        if result.dtype != bucket.dtype:
            result = result.to(bucket.dtype)
        finish_(result, self.op, self.postscale, self.process_set.size())
        flags = None  # read from the device only for a parameter without a local gradient (a sync on a GPU)
        with torch.no_grad():
            for slot, p in enumerate(bucket.params):
                if p.grad is None:
                    flags = buffer[size:size + len(bucket.params)].tolist() if flags is None else flags
                    if flags[slot] <= 0:
                        continue  # no rank had a gradient for it: it stays None, as in Horovod
                start = bucket.offsets[slot]
                value = result[start:start + bucket.numels[slot]].view(p.shape)
                if p.grad is None:
                    p.grad = value.clone()
                elif p.grad.is_sparse:
                    # Sparse gradients (nn.Embedding(sparse=True)) were reduced densely; they go back
                    # sparse, as Horovod writes them (``p.grad.zero_().add_(aggregated.to_sparse())``),
                    # so optimizers that need sparse gradients (SparseAdam) still get them.
                    p.grad = value.to_sparse()
                else:
                    p.grad.copy_(value)

    def _reset(self) -> None:
        for bucket in self.buckets:
            bucket.clear()
        for pid in self._delay:
            self._delay[pid] = self.backward_passes_per_step
        self._next = 0
        self._started = False

    @waits_for_peers()
    def abandon(self) -> None:
        """Forget this step's gradients (after waiting for reductions already in flight)."""
        for bucket in self.buckets:
            if bucket.pending is not None:
                bucket.pending[0].wait()
        self._reset()

    def set_backward_passes_per_step(self, passes: int) -> None:
        _positive(passes)
        self.backward_passes_per_step = passes
        for pid in self._delay:
            self._delay[pid] = passes

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

def _positive(passes) -> None:
    if not isinstance(passes, int) or passes < 1:
        raise RingtrainError(f"backward_passes_per_step={passes!r}", "use a positive integer (1 = no accumulation).")


def spec_of(ps: ProcessSet, layout_hash: int) -> list[tuple]:
    """The wire spec of this rank's gradient layout on ``ps`` with that hash (a joined rank mirrors it)."""
    return ps.part(Layouts).spec_of(layout_hash)


def post_zeros(spec: list[tuple], ps: ProcessSet) -> list:
    """Zero buckets of ``spec`` on the gradient group, started now: (buffers, works)."""
    buffers = [torch.zeros(numel, dtype=dtype, device=device) for numel, dtype, device, _ in spec]
    works = [dist.all_reduce(b, op=op, group=ps.grad_group_for(b), async_op=True)
             for b, (_, _, _, op) in zip(buffers, spec)]
    return [buffers, works]


@waits_for_peers()
def flush(spec: list[tuple], ps: ProcessSet) -> None:
    """Complete the zero buckets that joined ranks hold posted for ``spec`` (all zeros: nobody stepped)."""
    for work in post_zeros(spec, ps)[1]:
        work.wait()
