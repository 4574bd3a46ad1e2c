"""One device mesh per job: where every parallelism takes its ranks.

A strategy describes its layout as named dimensions, outermost first, and the job's ranks
fill them in row-major order (torchtitan's ``ParallelDims``; Megatron-LM's rank order):

    DDP, Horovod            ("dp_replicate", W)
    FSDP                    ("dp_shard", W)
    FSDP(replicate=k)       ("dp_replicate", k), ("dp_shard", W/k)      HSDP: shard within a group, replicate across
    Pipeline(stages=S)      ("pp", S), then its data strategy's dimensions over W/S
    TP(N)                   ("tp", N)                                   every rank of the group reads the same batch
    DDP(tp=N), FSDP(tp=N)   the data dimensions over W/N, then ("tp", N)  innermost: a TP group is neighbouring ranks

``Layout`` is that description and its arithmetic (which data shard a rank reads); ``build``
turns it into torch's ``DeviceMesh`` (``init_device_mesh``), whose sub-meshes
(``mesh["dp_shard"]``) carry the process groups each parallelism runs on. Nothing else in
ringtrain computes a rank layout by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import RingtrainError

PP, DP_REPLICATE, DP_SHARD, TP = "pp", "dp_replicate", "dp_shard", "tp"
DATA_DIMS = (DP_REPLICATE, DP_SHARD)  # the dimensions the data is sharded over


@dataclass(frozen=True)
class Layout:
    """Named mesh dimensions, outermost first: ``Layout((("pp", 2), ("dp_shard", 2)))``."""

    dims: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        names = [name for name, _ in self.dims]
        if len(set(names)) != len(names) or any(size < 1 for _, size in self.dims):
            raise RingtrainError(f"a device mesh got dimensions {self.dims}", "give each dimension one unique name "
                                 "and a positive size.")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.dims)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.dims)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def dim(self, name: str) -> int:
        return dict(self.dims).get(name, 1)

    def coordinates(self, rank: int) -> dict[str, int]:
        """Rank ``rank``'s index along each dimension (row-major: the last dimension varies fastest)."""
        out = {}
        for name, size in reversed(self.dims):
            rank, out[name] = divmod(rank, size)
        return {name: out[name] for name in self.names}

    def data_parallel_size(self) -> int:
        """How many different shards of the data the job reads."""
        return math.prod(size for name, size in self.dims if name in DATA_DIMS)

    def data_parallel_rank(self, rank: int) -> int:
        """Which shard ``rank`` reads: its index over the data dimensions, row-major."""
        where, index = self.coordinates(rank), 0
        for name, size in self.dims:
            if name in DATA_DIMS:
                index = index * size + where[name]
        return index

    def rank_without(self, rank: int, name: str) -> int:
        """``rank``'s index over every dimension but ``name``, row-major: the ranks of one ``name`` group (a
        tensor-parallel group) share it."""
        where, index = self.coordinates(rank), 0
        for dim, size in self.dims:
            if dim != name:
                index = index * size + where[dim]
        return index

    def __str__(self) -> str:
        return " x ".join(f"{name}={size}" for name, size in self.dims)


def data_layout(world: int, replicate: int = 1, shard: bool = False) -> tuple[tuple[str, int], ...]:
    """The data dimensions over ``world`` ranks: replicated (DDP), sharded (FSDP), or HSDP (both)."""
    if not shard:
        return ((DP_REPLICATE, world),)
    if replicate == 1:
        return ((DP_SHARD, world),)
    return ((DP_REPLICATE, replicate), (DP_SHARD, world // replicate))


def with_tp(data: tuple[tuple[str, int], ...], tp: int) -> tuple[tuple[str, int], ...]:
    """``data``'s dimensions, then ``("tp", tp)`` innermost (none for tp=1): a tensor-parallel group exchanges
    activations every layer, so it takes neighbouring ranks (one node's), as torchtitan's mesh and Megatron-LM put it."""
    return (*data, (TP, tp)) if tp > 1 else data


def data_ranks(world: int, tp: int, asked: str) -> int:
    """How many data-parallel ranks ``world`` ranks make in groups of ``tp``; ``asked`` (the strategy as written)
    is refused, with the divisors, when ``tp`` does not divide ``world``."""
    if world % tp:
        divisors = ", ".join(str(d) for d in range(1, world + 1) if world % d == 0)
        raise RingtrainError(
            f"{asked} needs the {world} processes started to form tensor-parallel groups of {tp}, and {tp} does "
            f"not divide {world}",
            f"start a multiple of {tp} processes (data-parallel replicas x tp), or choose tp among the divisors of "
            f"{world}: {divisors}.")
    return world // tp


def build(layout: Layout, device_type: str):
    """torch's ``DeviceMesh`` for ``layout`` on the job's default process group (collective: every rank calls it)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, layout.shape, mesh_dim_names=layout.names)
