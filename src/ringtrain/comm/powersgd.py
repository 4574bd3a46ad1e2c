"""PowerSGD gradient compression for DDP (Vogels et al., 2019), on Gloo and NCCL alike.

Each gradient matrix M (a parameter's gradient viewed as rows x the rest) is sent as two thin
matrices: P = M Q (rows x r) and Q = M^T P (the rest x r), r = ``rank``; what travels per step is
(rows + rest) x r numbers instead of rows x rest. The part the approximation misses is kept and
added to the next step's gradient (error feedback), so nothing is lost, only delayed. Tensors too
small to gain (biases, norms, matrices with (rows + rest) x r x ``min_compression_rate`` >= rows x
rest) travel whole, in the same all-reduce as the P matrices.

Why not torch's ``powerSGD_hook``: with more than one gradient bucket it chains asynchronous
all-reduces whose order differs between ranks, which Gloo aborts on ("Received data size doesn't
match expected size") or hangs on; it also all-reduces plainly for its first 1,000 steps without
saying so. Here one thread per replica does every bucket's work in the order DDP hands the buckets
over (the same on every rank): its two all-reduces one after the other, so every rank issues the
same sequence; backward goes on computing meanwhile (the hook returns at once). The start is an
option (``start_step``, default 0: compressed from the first step).

The state is keyed by parameter name, not by bucket, so it survives DDP rebuilding its buckets
after the first step and a restart: ``ring.save`` keeps the Q matrices (equal on every rank), every
rank's error feedback and the step count; ``ring.load`` at the same world size continues exactly.
"""

from __future__ import annotations

import queue
import threading
import zlib
from typing import Any

import torch
import torch.distributed as dist

from ..errors import RingtrainError
from .traffic import Traffic


class PowerSGD:
    """``rt.strategies.DDP(compression=PowerSGD(rank=4))``: the options of PowerSGD compression.

    ``rank``: columns of the low-rank factors (higher: closer to the true gradient, more bytes; 8 kept
    the digits CNN within a point of uncompressed training in 270 steps, 4 lost 2-5 points).
    ``start_step``: optimizer steps all-reduced plainly before compression starts (torch's hook
    waits 1,000 steps by default; here 0 unless you ask). ``min_compression_rate``: a matrix is
    compressed only when that shrinks it at least this many times. ``warm_start``: reuse last step's
    Q (one power iteration per step converges over steps). ``seed``: Q's first values, equal on every rank.
    """

    def __init__(self, rank: int = 8, *, start_step: int = 0, min_compression_rate: float = 2.0,
                 warm_start: bool = True, seed: int = 0, batched: bool = False):
        if batched:  # torch's batched_powerSGD_hook: one matrix for the whole bucket
            raise RingtrainError(
                "PowerSGD got batched=True: batched PowerSGD is not offered (torch's batched hook compresses a "
                "bucket as one square matrix, mixing layers, and raises an empty AssertionError in _orthogonalize "
                "on this torch)",
                "drop batched=True: ringtrain's PowerSGD already sends each bucket in two all-reduces, with "
                "every layer compressed on its own.")
        for name, value, low in (("rank", rank, 1), ("start_step", start_step, 0), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise RingtrainError(f"PowerSGD got {name}={value!r}", f"pass an integer >= {low}.")
        if isinstance(min_compression_rate, bool) or not isinstance(min_compression_rate, (int, float)) \
                or min_compression_rate < 0:
            raise RingtrainError(f"PowerSGD got min_compression_rate={min_compression_rate!r}",
                                 "pass a number >= 0 (2.0: compress a matrix only when it shrinks at least twice).")
        self.rank, self.start_step, self.seed = rank, start_step, seed
        self.min_compression_rate, self.warm_start = float(min_compression_rate), bool(warm_start)

    def __repr__(self) -> str:
        return f"PowerSGD(rank={self.rank}, start_step={self.start_step})"


class PowerSGDHook(Traffic):
    """One replica's PowerSGD state and its DDP comm hook (``register_comm_hook(state, PowerSGDHook.hook)``)."""

    def __init__(self, options: PowerSGD, names: dict[torch.Tensor, str], group: Any):
        super().__init__()
        self.options = options
        self.names = names  # parameter (by identity) -> its name in the model
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.q: dict[str, torch.Tensor] = {}
        self.error: dict[str, torch.Tensor] = {}
        self.steps = 0  # backward passes whose gradients were all-reduced
        self.hook_name = "powersgd_hook"  # on the timeline
        self._work: queue.SimpleQueue | None = None  # buckets for the worker thread, in DDP's order

    # --- the hook: hands the bucket to the worker, which completes the future ------------------
    @staticmethod
    def hook(state, bucket):  # unannotated: DDP checks real annotations, and this module's are strings
        future: torch.futures.Future = torch.futures.Future()
        if state._work is None:
            state._work = queue.SimpleQueue()
            threading.Thread(target=state._serve, args=(state._work,), name="ringtrain-powersgd", daemon=True).start()
        state._work.put((bucket.buffer(), bucket.parameters(), bucket.gradients(), bucket.is_last(), future))
        return future

    def _serve(self, work: queue.SimpleQueue) -> None:
        while True:
            buffer, params, grads, last, future = work.get()
            try:
                self._reduce(buffer, params, grads, last)
            except BaseException as e:  # DDP raises it in backward, on the main thread
                future.set_exception(e)
            else:
                future.set_result(buffer)

    def _reduce(self, buffer: torch.Tensor, params: list, grads: list, last: bool) -> None:
        if self.steps < self.options.start_step:
            self._all_reduce(buffer)
            buffer.div_(self.world_size)
        else:
            self._compress(params, grads)
        if last:
            self.steps += 1
            self.step_done()

    def _all_reduce(self, tensor: torch.Tensor) -> None:
        self.count(tensor.numel() * tensor.element_size())
        dist.all_reduce(tensor, group=self.group)  # waited for here: the next all-reduce is issued after it

    def _compress(self, params: list, grads: list) -> None:
        # Kept transposed (P^T: r x rows, Q^T: r x rest): P^T = Q^T M^T and Q^T = P^T M multiply along
        # M's rows, 4-10x faster on a CPU than M Q and M^T P (measured: 1024^2, r = 8).
        compressed, whole = [], []
        for param, grad in zip(params, grads):
            shape = self._matrix_shape(grad)
            (compressed if shape else whole).append((self.names.get(param, f"#{id(param)}"), grad, shape))
        matrices, pts = [], []
        for name, grad, (rows, rest) in compressed:
            g = grad.detach().reshape(rows, rest)
            m = self.error.get(name)
            if m is not None and m.shape == g.shape:
                m.add_(g)  # M = gradient + the error fed back, in the error's own buffer
            else:
                m = g.float().clone()
            matrices.append(m)
            pts.append(self._qt(name, rest, m.device) @ m.t())
        # 1: every P and every whole tensor, summed in one all-reduce.
        flat = torch.cat([p.flatten() for p in pts] + [g.flatten().float() for _, g, _ in whole]) \
            if pts or whole else None
        if flat is not None:
            self._all_reduce(flat)
        offset = 0
        for i, pt in enumerate(pts):
            pts[i] = _orthonormal(flat[offset:offset + pt.numel()].view_as(pt).t()).t()
            offset += pt.numel()
        for _, grad, _ in whole:
            grad.copy_(flat[offset:offset + grad.numel()].view_as(grad)).div_(self.world_size)
            offset += grad.numel()
        if not pts:
            return
        # 2: every Q^T = P^T M, averaged in a second all-reduce.
        flat_q = torch.cat([(pt @ m).flatten() for m, pt in zip(matrices, pts)])
        self._all_reduce(flat_q)
        flat_q.div_(self.world_size)
        # A non-finite gradient (the ring then skips the step) must not poison the kept state.
        keep = bool(torch.isfinite(flat_q).all()) and bool(torch.isfinite(flat).all())
        offset = 0
        for (name, grad, _), m, pt in zip(compressed, matrices, pts):
            qt = flat_q[offset:offset + pt.shape[0] * m.shape[1]].view(pt.shape[0], m.shape[1])
            offset += qt.numel()
            if grad.dtype == m.dtype and grad.is_contiguous():
                approx = torch.mm(pt.t(), qt, out=grad.view(m.shape))  # written into the bucket directly
            else:
                approx = pt.t() @ qt
                grad.copy_(approx.view_as(grad))
            if keep:
                self.error[name] = m.sub_(approx)
                if self.options.warm_start:
                    self.q[name] = qt.clone()
            else:
                self.error.pop(name, None)

    def _matrix_shape(self, grad: torch.Tensor) -> tuple[int, int] | None:
        if grad.dim() < 2:
            return None
        rows = grad.shape[0]
        rest = grad.numel() // rows
        r = min(self.options.rank, rows, rest)
        if (rows + rest) * r * self.options.min_compression_rate > rows * rest:
            return None
        return rows, rest

    def _qt(self, name: str, rest: int, device: torch.device) -> torch.Tensor:
        """Q^T (r x rest): last step's (warm start), or fresh random orthonormal rows."""
        r = min(self.options.rank, rest)
        qt = self.q.get(name)
        if qt is None or qt.shape != (r, rest) or not self.options.warm_start:
            # Equal on every rank: seeded by the option's seed and the parameter's name, never by rank.
            generator = torch.Generator().manual_seed(self.options.seed * 1_000_003 + zlib.crc32(name.encode()))
            qt = _orthonormal(torch.randn(rest, r, generator=generator)).t().contiguous()
            self.q[name] = qt
        return qt.to(device)

    # --- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's state on the CPU: Q^T (equal on all ranks), its own error feedback, the step count."""
        return {"steps": self.steps, "q": {k: v.cpu() for k, v in self.q.items()},
                "error": {k: v.cpu() for k, v in self.error.items()}}

    def load_state_dict(self, saved: dict[str, Any], error: bool = True) -> None:
        """Continue from ``saved``; ``error=False`` (another world size): error feedback starts afresh."""
        devices = {name: param.device for param, name in self.names.items()}
        cpu = torch.device("cpu")
        self.steps = int(saved.get("steps", 0))
        self.q = {k: v.to(devices.get(k, cpu)) for k, v in (saved.get("q") or {}).items()}
        self.error = {k: v.to(devices.get(k, cpu)) for k, v in (saved.get("error") or {}).items()} if error else {}


def _orthonormal(p: torch.Tensor) -> torch.Tensor:
    """P's columns made orthonormal (a reduced QR; deterministic, so equal inputs give equal outputs)."""
    return torch.linalg.qr(p, mode="reduced").Q
