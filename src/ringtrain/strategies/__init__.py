"""The ways of running, and how one is chosen for a process.

One file per strategy behind the small contract in base.py. ``choose_strategy``
is the one place that maps a name and an environment to a strategy object.
"""

from __future__ import annotations

import dataclasses
import datetime

import torch

from ..environments import Environment
from ..errors import RingtrainError
from .base import Strategy
from .ddp import DDPStrategy
from .dp import DataParallelStrategy
from .hvd import HvdStrategy
from .pipeline import PipelineStrategy
from .single import SingleDevice

STRATEGIES = ("auto", "single", "dp", "ddp", "hvd", "pipeline")
DEFAULT_TIMEOUT_S = 1800.0


def _timeout(value: float | datetime.timedelta) -> datetime.timedelta:
    if isinstance(value, datetime.timedelta):
        return value
    if not isinstance(value, (int, float)) or value <= 0:
        raise RingtrainError(f"Ring got timeout={value!r}", "pass a positive number of seconds or a datetime.timedelta.")
    return datetime.timedelta(seconds=float(value))


def _explicit(env: Environment, world_size: int | None, rank: int | None) -> Environment:
    """Apply ``Ring(world_size=..., rank=...)``; a launcher that says otherwise is an error."""
    if world_size is None and rank is None:
        return env
    if env.is_distributed:
        if world_size is not None and world_size != env.world_size:
            raise RingtrainError(
                f"Ring(world_size={world_size}) was asked for, but the launcher ({env.name}) started "
                f"{env.world_size} processes",
                "drop world_size= and let the launcher decide, or launch with a matching process count.",
            )
        if rank is not None and rank != env.rank:
            raise RingtrainError(
                f"Ring(rank={rank}) was asked for, but the launcher ({env.name}) says this is rank {env.rank}",
                "drop rank= when a launcher starts the processes.",
            )
        return env
    if world_size is None or rank is None:
        raise RingtrainError(
            "Ring got only one of world_size= and rank=",
            "give both (with init_method='tcp://host:port' or 'file:///path'), or start with `ringtrain run`.",
        )
    if world_size < 1 or not 0 <= rank < world_size:
        raise RingtrainError(
            f"Ring got rank={rank} for world_size={world_size}",
            "rank must be in [0, world_size).",
        )
    # Processes started by hand are taken to share one node, local rank = rank.
    return dataclasses.replace(
        env, name="explicit", rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size
    )


def choose_strategy(
    name: str,
    env: Environment,
    *,
    world_size: int | None = None,
    rank: int | None = None,
    device: str = "auto",
    backend: str | None = None,
    init_method: str | None = None,
    timeout: float | datetime.timedelta = DEFAULT_TIMEOUT_S,
    pipeline: dict | None = None,
    accumulate: int = 1,
    compression: str = "none",
) -> Strategy:
    """The strategy for ``name`` (``"auto"`` decides from the environment), not yet set up.

    ``pipeline``: stages, microbatches, schedule, split_at — only with ``name="pipeline"``.
    """
    env = _explicit(env, world_size, rank)
    timeout = _timeout(timeout)
    if name not in STRATEGIES:
        raise RingtrainError(f"unknown strategy {name!r}", f"use one of {', '.join(STRATEGIES)}.")
    if device not in ("auto", "cpu", "cuda"):
        raise RingtrainError(f"Ring got device={device!r}", "use 'auto', 'cpu' or 'cuda'.")
    if device == "cuda" and not torch.cuda.is_available():
        raise RingtrainError("Ring(device='cuda') was asked for, but torch sees no CUDA device", "use device='auto'.")
    if pipeline and name != "pipeline":
        raise RingtrainError(
            f"Ring got pipeline options {sorted(pipeline)} with strategy={name!r}",
            "use strategy='pipeline' with stages=, microbatches=, schedule=, split_at=.",
        )
    if name == "pipeline":
        options = dict(pipeline or {})
        if options.get("stages") is None or options.get("microbatches") is None:
            raise RingtrainError(
                "strategy='pipeline' needs stages= and microbatches=",
                "e.g. Ring(strategy='pipeline', stages=2, microbatches=8, schedule='1f1b').",
            )
        return PipelineStrategy(env, device=device, backend=backend, init_method=init_method, timeout=timeout, **options)
    if name == "auto":
        name = "ddp" if env.is_distributed or init_method is not None else "single"
    if name == "dp":
        return DataParallelStrategy(env, device=device)
    if name == "single":
        if env.is_distributed:
            raise RingtrainError(
                f"strategy='single' was asked for, but the launcher ({env.name}) started {env.world_size} "
                "processes: each would train its own copy on all the data",
                "use strategy='auto' or 'ddp', or launch one process (python train.py).",
            )
        return SingleDevice(env, device=device)
    if name == "hvd":
        # Horovod's DistributedOptimizer in place of DDP: accumulation is its backward_passes_per_step.
        return HvdStrategy(env, device=device, backend=backend, init_method=init_method, timeout=timeout,
                           backward_passes_per_step=accumulate, compression=compression)
    return DDPStrategy(env, device=device, backend=backend, init_method=init_method, timeout=timeout,
                       compression=compression)
