"""A step's predicted time and MFU from its FLOPs, its traffic and the device (devices.py).

The model, in one place: computation runs at ``EFFICIENCY`` of the device's dense peak; each mesh dimension's
traffic runs at its link's bandwidth (within a node when the dimension and those inside it fit on one node, else
between nodes) times ``LINK_EFFICIENCY``; the data dimensions' traffic (DDP's all-reduce, FSDP's all-gathers and
reduce-scatters) overlaps with computation — DDP's with backward (two thirds of it), FSDP's with the whole step —
and only what sticks out counts; tensor parallelism's waits on every layer and counts whole, and so does CPU
offload's traffic to the host (``HOST_GBPS``). MFU is the model's
FLOPs (without recomputation) over the step time and the peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .devices import Device
from .layouts import Layout

EFFICIENCY = 0.5  # achieved / peak FLOP/s of a training step's kernels
LINK_EFFICIENCY = 0.8  # achieved / nominal link bandwidth of ring collectives
BACKWARD_SHARE = 2 / 3  # backward's share of a step's computation: where DDP's all-reduce hides
HOST_GBPS = 25.0  # GB/s between a device and its host (PCIe 4.0 x16): CPU offload's traffic


@dataclass(frozen=True)
class Timing:
    compute_s: float
    comm_s: float  # all of it
    exposed_s: float  # what computation does not hide
    step_s: float
    mfu: float


def _inner_ranks(layout: Layout, dim: str) -> int:
    """The ranks a group of ``dim`` spans: its size times the dimensions inside it."""
    names = [n for n, _ in layout.dims]
    sizes = dict(layout.dims)
    return sizes[dim] * math.prod(sizes[n] for n in names[names.index(dim) + 1:])


def step_time(layout: Layout, flops: int, model_flops: int, traffic: dict[str, int], device: Device,
              half: bool, per_node: int) -> Timing:
    peak = device.peak(half)
    compute = flops / (peak * EFFICIENCY)
    overlap = {"dp_replicate": BACKWARD_SHARE if layout.data == "ddp" else 1.0, "dp_shard": 1.0, "tp": 0.0, "host": 0.0}
    comm = exposed = 0.0
    hidden_left = compute
    for dim, sent in traffic.items():
        within = _inner_ranks(layout, dim) <= per_node if dim in dict(layout.dims) else True
        gbps = HOST_GBPS if dim == "host" else device.intra_gbps if within else device.inter_gbps
        seconds = sent / (gbps * 1e9 * LINK_EFFICIENCY)
        comm += seconds
        hides = min(seconds, hidden_left * overlap.get(dim, 0.0))
        hidden_left -= hides
        exposed += seconds - hides
    step = compute + exposed
    return Timing(compute, comm, exposed, step, model_flops / (step * peak) if step > 0 else 0.0)
