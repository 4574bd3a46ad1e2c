"""The layouts a plan weighs: how the job's ranks hold the model (``Layout``), and which the model and world allow.

A layout is the mesh of parallel/mesh.py (``dp_replicate x dp_shard x tp``, outermost first) plus what is done inside
each rank: activation checkpointing of the repeated blocks as ``Ring(activation_checkpointing=...)`` does it (``off``,
``full``: each block recomputed in backward, ``selective``: the matmuls' and attention's outputs kept, the rest
recomputed; strategies/checkpointing.py) and FSDP's CPU offload. ``candidates`` lists them for a world:
DDP, FSDP, HSDP (a shard group per node), TP alone, DDP x TP and FSDP x TP (TP within a node, as tensor parallelism
exchanges activations every layer), each with the three AC modes, and FSDP's offload.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from torch import nn

from ..errors import RingtrainError
from ..strategies import _tp_plan, _units

AC_MODES = ("off", "full", "selective")


@dataclass(frozen=True)
class Layout:
    """One way of running: the mesh dimensions, the data strategy over them, AC, offload."""

    data: str  # "single", "ddp" or "fsdp"
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    ac: str = "off"
    offload: bool = False

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def dims(self) -> tuple[tuple[str, int], ...]:
        """The mesh, outermost first (parallel/mesh.py's names)."""
        dims = (("dp_replicate", self.dp_replicate), ("dp_shard", self.dp_shard), ("tp", self.tp))
        return tuple((n, s) for n, s in dims if s > 1 or (self.data == "fsdp" and n == "dp_shard"))

    @property
    def name(self) -> str:
        if self.data == "single" and self.tp == 1:
            base = "one device"
        elif self.data == "single":
            base = f"TP {self.tp}"
        elif self.data == "ddp":
            base = f"DDP {self.dp_replicate}"
        elif self.dp_replicate > 1:
            base = f"HSDP {self.dp_replicate}x{self.dp_shard}"
        else:
            base = f"FSDP {self.dp_shard}"
        if self.tp > 1 and self.data != "single":
            base += f" x TP {self.tp}"
        extras = [f"AC {self.ac}"] if self.ac != "off" else []
        extras += ["offload"] if self.offload else []
        return base + (f" + {', '.join(extras)}" if extras else "")

    def strategy_line(self) -> str:
        """The exact ``Ring(...)`` strategy that runs this layout (AC and offload as the strategy's options)."""
        tp = f"tp={self.tp}" if self.tp > 1 else ""
        if self.data == "single":
            core = f"rt.strategies.TP({self.tp})" if self.tp > 1 else '"single"'
        elif self.data == "ddp":
            core = f"rt.strategies.DDP({tp})" if tp else '"ddp"'
        else:
            args = [a for a in (tp, f"replicate={self.dp_replicate}" if self.dp_replicate > 1 else "",
                                'offload="cpu"' if self.offload else "") if a]
            core = f"rt.strategies.FSDP({', '.join(args)})" if args else '"fsdp"'
        return f"rt.Ring(strategy={core}" + (f', activation_checkpointing="{self.ac}")' if self.ac != "off" else ")")

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "name": self.name, "strategy": self.strategy_line()}


def tp_degrees(model: nn.Module, world_size: int, per_node: int) -> list[int]:
    """The TP degrees the model's inferred plan takes: divisors of the ranks of one node (> 1) it can cut."""
    degrees = []
    for tp in range(2, min(world_size, per_node) + 1):
        if world_size % tp or per_node % tp:
            continue
        try:
            _tp_plan.infer(model, tp, False)
        except RingtrainError:
            continue
        degrees.append(tp)
    return degrees


def candidates(model: nn.Module, world_size: int, nnodes: int = 1, ac_modes: tuple[str, ...] = AC_MODES,
               offload: bool = True, tp: bool = True) -> list[Layout]:
    """Every layout the model and the world allow, in the table's order."""
    if world_size < 1 or world_size % nnodes:
        raise RingtrainError(f"a plan for {world_size} ranks on {nnodes} nodes",
                             "give a world size that the number of nodes divides (--nproc-per-node N --nnodes M).")
    per_node = world_size // nnodes
    has_blocks = bool(_units.repeated(model))
    modes = [m for m in ac_modes if m == "off" or has_blocks]
    bases: list[Layout] = []
    if world_size == 1:
        bases.append(Layout("single"))
    else:
        bases.append(Layout("ddp", dp_replicate=world_size))
        bases.append(Layout("fsdp", dp_shard=world_size))
        if nnodes > 1:
            bases.append(Layout("fsdp", dp_replicate=nnodes, dp_shard=per_node))
        for degree in (tp_degrees(model, world_size, per_node) if tp else []):
            dp = world_size // degree
            if dp == 1:
                bases.append(Layout("single", tp=degree))
            else:
                bases.append(Layout("ddp", dp_replicate=dp, tp=degree))
                bases.append(Layout("fsdp", dp_shard=dp, tp=degree))
    layouts = [Layout(b.data, b.dp_replicate, b.dp_shard, b.tp, ac=m) for b in bases for m in modes]
    if offload and world_size > 1:
        layouts += [Layout("fsdp", dp_shard=world_size, ac=m, offload=True) for m in modes]
    return layouts
