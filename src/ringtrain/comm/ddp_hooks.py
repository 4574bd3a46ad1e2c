"""What DDP's gradients travel as: the comm hook behind ``rt.strategies.DDP(compression=...)``.

``"none"``  no hook: DDP's own all-reduce, in its C++ reducer.
``"fp16"`` / ``"bf16"``  each bucket is cast, divided by the world size, all-reduced and cast back
           (one asynchronous all-reduce per bucket, issued in DDP's bucket order: the same on every
           rank). torch's bf16 hook refuses Gloo ("required CUDA 11+ and NCCL 2.10+"); this one runs
           wherever the backend all-reduces bfloat16 (Gloo and NCCL do).
``PowerSGD``  low-rank factors with error feedback (powersgd.py).
``"auto"``  measured once at start-up (``choose``): the link's all-reduce bandwidth decides.

Every hook counts the bytes it all-reduced in the last complete step (``sent_last_step``), which
``ringtrain bench`` reports; without a hook, the gradients' own size is what travels.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from ..errors import RingtrainError
from .powersgd import PowerSGD, PowerSGDHook
from .traffic import Traffic

NAMES = ("none", "fp16", "bf16", "powersgd", "auto")
CAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


def check(compression: Any) -> Any:
    """``compression`` as DDP keeps it: one of NAMES (``"powersgd"`` becomes ``PowerSGD()``) or a PowerSGD."""
    if isinstance(compression, PowerSGD):
        return compression
    if compression not in NAMES:
        raise RingtrainError(f"DDP got compression={compression!r}",
                             f"use one of {', '.join(map(repr, NAMES))}, or rt.strategies.PowerSGD(rank=...).")
    return PowerSGD() if compression == "powersgd" else compression


class CastHook(Traffic):
    """fp16 / bf16: one bucket's gradients travel as ``dtype``."""

    def __init__(self, dtype: torch.dtype, group: Any):
        super().__init__()
        self.dtype, self.group = dtype, group
        self.world_size = dist.get_world_size(group)
        self.hook_name = f"{'fp16' if dtype == torch.float16 else 'bf16'}_hook"  # on the timeline

    @staticmethod
    def hook(state, bucket):  # unannotated: DDP checks real annotations, and this module's are strings
        buffer = bucket.buffer()
        compressed = buffer.to(state.dtype).div_(state.world_size)
        state.count(compressed.numel() * compressed.element_size())
        if bucket.is_last():
            state.step_done()
        future = dist.all_reduce(compressed, group=state.group, async_op=True).get_future()

        def restore(fut: torch.futures.Future) -> torch.Tensor:
            buffer.copy_(fut.value()[0])
            return buffer

        return future.then(restore)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, saved: dict[str, Any], error: bool = True) -> None:
        return None


def make_hook(compression: Any, module: nn.Module, group: Any) -> tuple[Any, Callable] | None:
    """(state, hook) for ``register_comm_hook``, or None for DDP's own all-reduce."""
    if compression == "none":
        return None
    if compression in CAST:
        state = CastHook(CAST[compression], group)
        return state, CastHook.hook
    if isinstance(compression, PowerSGD):
        names = {param: name for name, param in module.named_parameters()}
        state = PowerSGDHook(compression, names, group)
        return state, PowerSGDHook.hook
    raise AssertionError(f"unresolved compression {compression!r}")


def gradient_bytes(module: nn.Module) -> int:
    """Bytes of the trainable gradients: what DDP's own all-reduce sends each step."""
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


# --- "auto": measure the link, then pick -------------------------------------------------------
PROBE_BYTES = 4 << 20
PROBE_REPEATS = 3
# The gradient all-reduce's estimated time per step below which it is left alone (it hides under
# backward, or costs little); bf16 halves it; beyond that PowerSGD's ~100x fewer bytes win.
HIDES_MS = 25.0


@dataclass(frozen=True)
class LinkChoice:
    bus_gbit: float  # measured all-reduce bus bandwidth (nccl-tests' busbw), Gbit/s
    full_ms: float  # the estimated time to all-reduce this model's gradients uncompressed
    compression: Any

    def describe(self, gradient_mb: float) -> str:
        return (f"compression='auto': the link all-reduces at {self.bus_gbit:.2f} Gbit/s (bus bandwidth, "
                f"{PROBE_REPEATS} x {PROBE_BYTES >> 20} MiB); {gradient_mb:.1f} MB of gradients would take "
                f"{self.full_ms:.0f} ms a step -> {self.compression!r}")


def rule(bus_bytes_per_s: float, grad_bytes: int, world_size: int) -> LinkChoice:
    """The documented choice: none if the uncompressed all-reduce takes < HIDES_MS a step, bf16 if half
    of it does, PowerSGD otherwise."""
    full_s = grad_bytes * 2 * (world_size - 1) / world_size / max(bus_bytes_per_s, 1.0)
    full_ms = full_s * 1e3
    if full_ms < HIDES_MS:
        choice: Any = "none"
    elif full_ms / 2 < HIDES_MS:
        choice = "bf16"
    else:
        choice = PowerSGD()
    return LinkChoice(bus_bytes_per_s * 8 / 1e9, full_ms, choice)


def measure_bus_bandwidth(group: Any, device: torch.device, nbytes: int = PROBE_BYTES,
                          repeats: int = PROBE_REPEATS) -> float:
    """Bytes/s of all-reduce bus bandwidth over ``group`` (algbw x 2(n-1)/n), rank 0's measurement on every
    rank (collective: every rank calls it)."""
    world = dist.get_world_size(group)
    tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dist.all_reduce(tensor, group=group)  # warm-up: connections and buffers
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    bus = nbytes / statistics.median(times) * 2 * (world - 1) / world
    shared = [bus]
    dist.broadcast_object_list(shared, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return float(shared[0])
