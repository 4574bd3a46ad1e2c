"""What a plan assumes of the hardware: a device's memory and peak, the links between ranks, and how they parse.

``DEVICES`` holds dense peak TFLOPS (bf16/fp16 tensor cores, and TF32 for fp32 training), memory, the link within a
node (NVLink, or PCIe) and between nodes (InfiniBand / Ethernet, per GPU), from the vendors' data sheets. A step's
time is a model, not a measurement (docs/plan.md says how it is computed): every figure here can be overridden.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..errors import RingtrainError

GiB = 2**30


@dataclass(frozen=True)
class Device:
    name: str
    memory: int  # bytes
    tflops_bf16: float  # dense peak, 16-bit tensor cores
    tflops_fp32: float  # dense peak for fp32 training (TF32 tensor cores where there are)
    intra_gbps: float  # GB/s one rank sends within a node (NVLink / PCIe)
    inter_gbps: float  # GB/s one rank sends to another node (InfiniBand / Ethernet, per GPU)

    def peak(self, half: bool) -> float:
        """FLOP/s at peak for the training's precision."""
        return (self.tflops_bf16 if half else self.tflops_fp32) * 1e12


DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("h100", 80 * GiB, 989.0, 494.0, 450.0, 50.0),
    Device("h200", 141 * GiB, 989.0, 494.0, 450.0, 50.0),
    Device("b200", 180 * GiB, 2250.0, 1100.0, 900.0, 50.0),
    Device("a100", 80 * GiB, 312.0, 156.0, 300.0, 25.0),
    Device("a100-40gb", 40 * GiB, 312.0, 156.0, 300.0, 25.0),
    Device("l40s", 48 * GiB, 362.0, 183.0, 32.0, 12.5),
    Device("a10g", 24 * GiB, 125.0, 62.5, 16.0, 12.5),
    Device("l4", 24 * GiB, 121.0, 60.0, 16.0, 12.5),
    Device("v100", 32 * GiB, 125.0, 15.7, 150.0, 12.5),
    Device("mi300x", 192 * GiB, 1307.0, 654.0, 448.0, 50.0),
    Device("cpu", 64 * GiB, 1.0, 1.0, 10.0, 1.25),
)}
DEFAULT = "h100"

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": GiB, "gb": 10**9, "gib": GiB, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_bytes(text: str | int | float, what: str = "--device-memory") -> int:
    """``80GiB``, ``80 GB``, ``81920MiB``, ``85899345920``: a size in bytes (a bare number is bytes)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return int(text)
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = found.group(2).lower() if found else None
    if not found or unit not in _UNITS:
        raise RingtrainError(f"{what} got {text!r}, which is not a size",
                             "give a number and a unit, e.g. 80GiB, 40GB or 24576MiB.")
    return int(float(found.group(1)) * _UNITS[unit])


def device_of(text: str | float | None, memory: str | int | None = None, *, intra_gbps: float | None = None,
              inter_gbps: float | None = None, what: str = "--device") -> Device:
    """A device by name (``h100``, ``a100``...), or a peak in TFLOPS (``400``: an H100's links and memory unless
    given), with the memory and links overridden where given."""
    if text is None:
        device = DEVICES[DEFAULT]
    elif isinstance(text, (int, float)) or re.fullmatch(r"\s*[0-9]*\.?[0-9]+\s*", str(text)):
        peak = float(text)
        if peak <= 0:
            raise RingtrainError(f"{what} got {text!r}", "give a positive peak in TFLOPS, or a device's name.")
        device = replace(DEVICES[DEFAULT], name=f"{peak:g} TFLOPS", tflops_bf16=peak, tflops_fp32=peak / 2)
    elif str(text).lower() in DEVICES:
        device = DEVICES[str(text).lower()]
    else:
        raise RingtrainError(f"{what} got {text!r}, a device this plan does not know",
                             f"give one of {', '.join(DEVICES)}, or its peak in TFLOPS (e.g. {what} 400).")
    changes: dict = {}
    if memory is not None:
        changes["memory"] = parse_bytes(memory)
    if intra_gbps is not None:
        changes["intra_gbps"] = float(intra_gbps)
    if inter_gbps is not None:
        changes["inter_gbps"] = float(inter_gbps)
    return replace(device, **changes) if changes else device
