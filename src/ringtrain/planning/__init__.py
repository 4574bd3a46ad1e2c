"""Will it fit, and which layout is fastest? ``rt.plan`` and ``ringtrain plan``: memory per rank and step time for
every layout, before the job starts, on fake tensors (trace.py), with nothing allocated and no process group formed.

    plan = rt.plan(model, optimizer, batch, world_size=8, device="h100")
    print(plan)                      # the table; plan.rows: Row dataclasses; plan.save("plan/"): JSON, text, PNG

``mode.py`` is the planning mode ``ringtrain plan`` runs a script in: ``Ring.setup`` hands it the real model and
optimizer, the model's first forward hands it the batch, and it plans, prints and exits.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Iterable

import torch
from torch import nn

from ..errors import RingtrainError, one_line
from ..loop import precision as precisions
from . import cost, trace as tracing
from .devices import Device, device_of
from .layouts import AC_MODES, Layout, candidates
from .report import Plan, Row
from .trace import Measured, fake_world

__all__ = ["plan", "Plan", "Row", "Layout", "Device", "candidates"]

_HALF = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def plan(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any, *, world_size: int = 1, nnodes: int = 1,
         device_memory: str | int | None = None, device: str | float | None = None, precision: Any = "32",
         layouts: Iterable[Layout] | None = None, ac: Iterable[str] = AC_MODES, offload: bool = True,
         loss_fn: Callable[..., torch.Tensor] | None = None, intra_gbps: float | None = None,
         inter_gbps: float | None = None, script_strategy: str | None = None) -> Plan:
    """Plan one training step of ``model`` with ``optimizer`` on ``batch`` (what the model takes: a tensor, a tuple
    of its arguments, a dict of keywords; real, meta or fake tensors) for every layout of ``world_size`` ranks on
    ``nnodes`` nodes, on ``device`` (a name from planning/devices.py, or a peak in TFLOPS) with ``device_memory``
    (default: the device's). ``loss_fn(output, batch)``: the loss (default: the output when it is a number, else
    cross-entropy over its last dimension). Returns the ``Plan``: its rows, the fastest that fits marked."""
    hardware = device_of(device, device_memory, intra_gbps=intra_gbps, inter_gbps=inter_gbps)
    name = precisions.canonical(precision)
    dtype = _HALF.get(name)
    chosen = list(layouts) if layouts is not None else candidates(model, world_size, nnodes, tuple(ac), offload)
    per_node = world_size // max(nnodes, 1)
    rows: list[Row] = []
    measured: dict[Layout, Measured] = {}
    errors: list[Exception] = []
    with fake_world(world_size), torch.random.fork_rng(), warnings.catch_warnings():
        # torch's warnings about the fake step (FSDP's view outputs, the trackers' notes) are about no real run
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        for layout in chosen:
            started, cpu = time.perf_counter(), time.process_time()
            row = Row(layout.name, layout.strategy_line(), layout.world_size, layout.ac, layout.offload)
            try:
                measured[layout] = m = tracing.trace(model, optimizer, batch, layout, dtype=dtype, loss_fn=loss_fn,
                                                     count_flops=_flops_of(layout, chosen) == layout)
            except Exception as e:  # what the fake mode cannot trace: named on the row, raised if none traced
                row.error = e.message if isinstance(e, RingtrainError) else f"{type(e).__name__}: {one_line(e)}"
                errors.append(e)
            else:
                row.peak, row.host, row.traffic = m.peak, m.host, m.traffic
                for part, value in m.parts.items():
                    setattr(row, part, value)
                row.fits = m.peak <= hardware.memory
            row.trace_s, row.trace_cpu_s = time.perf_counter() - started, time.process_time() - cpu
            rows.append((layout, row))
    if rows and all(r.error for _, r in rows):
        first = rows[0][1]
        if isinstance(errors[0], RingtrainError):
            raise errors[0]
        raise RingtrainError(f"the plan could not trace one training step of the model ({first.error})",
                             "a model the fake mode cannot run (a data-dependent shape, a custom op without a fake "
                             "kernel) cannot be planned: give its custom ops a fake (meta) kernel "
                             "(torch.library.register_fake), or plan a model without them.") from errors[0]
    _time(rows, measured, hardware, dtype is not None, per_node)
    meta = {"parameters": sum(p.numel() for p in model.parameters()), "world_size": world_size, "nnodes": nnodes,
            "precision": name, "device": hardware.name, "device_memory": hardware.memory,
            "peak_tflops": hardware.peak(dtype is not None) / 1e12, "intra_gbps": hardware.intra_gbps,
            "inter_gbps": hardware.inter_gbps, "efficiency": cost.EFFICIENCY, "script_strategy": script_strategy,
            "optimizer": type(optimizer).__name__}
    return Plan([r for _, r in rows], meta)


def _flops_of(layout: Layout, chosen: list[Layout]) -> Layout:
    """The layout whose counted FLOPs give ``layout``'s: every data-parallel rank computes what one device does on
    its batch, and a TP rank that over the TP degree — so the plain data-parallel layout of the same activation
    checkpointing (FSDP's, where it is planned) is counted, and the others derived from it. (torch's counter sees
    DTensor's ops under activation checkpointing inconsistently: counting under TP is not relied on.)"""
    base = (Layout("fsdp", dp_shard=layout.world_size, ac=layout.ac) if layout.world_size > 1
            else Layout("single", ac=layout.ac))
    return base if base in chosen else layout


def _time(rows: list[tuple[Layout, Row]], measured: dict[Layout, Measured], hardware: Device, half: bool,
          per_node: int) -> None:
    """Each row's step time and MFU (cost.py); the fastest that fits (the most samples a second) marked."""
    from dataclasses import replace

    chosen = [layout for layout, _ in rows]

    def flops(layout: Layout) -> int | None:
        source = _flops_of(layout, chosen)
        base = measured.get(source)
        return None if base is None else base.flops if source == layout else base.flops // layout.tp

    for layout, row in rows:
        own = None if row.error else flops(layout)
        if own is None:  # not traced, or the layout its FLOPs come from was not: no time for it
            continue
        plain = flops(replace(layout, ac="off")) or own  # the model's FLOPs: without recomputation
        timing = cost.step_time(layout, own, plain, measured[layout].traffic, hardware, half, per_node)
        row.flops, row.step_s, row.mfu = own, timing.step_s, timing.mfu
    # The fastest trains the most samples a second: every layout runs the script's batch per rank and a TP group
    # shares one, so that is the highest MFU (the model's FLOPs per rank over its step time), not the shortest step.
    fitting = [r for _, r in rows if not r.error and r.fits and r.step_s > 0]
    if fitting:
        min(fitting, key=lambda r: (-round(r.mfu, 4), r.offload, r.peak)).fastest = True
