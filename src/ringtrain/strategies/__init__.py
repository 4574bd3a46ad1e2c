"""The ways of running: one class per file, each built by the user with its own options.

    rt.Ring(strategy=rt.strategies.DDP(find_unused_parameters=True))
    rt.Ring(strategy=rt.strategies.Pipeline(stages=2, microbatches=8, schedule="1f1b"))
    rt.Ring(strategy=rt.strategies.FSDP(wrap=[Block], replicate=2))
    rt.Ring(strategy=rt.strategies.FSDP(tp=rt.strategies.TP(2, sequence_parallel=True)))
    rt.Ring(strategy="ddp")        # a name is the class with its default options

``resolve`` is the one place that maps a name (or ``"auto"``) to a strategy object.
A new strategy is one new file here plus one line in ``REGISTRY`` (docs/architecture.md).
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..comm.powersgd import PowerSGD
from ..errors import RingtrainError
from ..parallel.environments import Environment
from .base import BackwardSyncControl, Distributed, PipelineSchedule, StageData, Strategy
from .ddp import DDP
from .dp import DataParallel
from .fsdp import FSDP
from .hvd import Horovod
from .pipeline import Pipeline
from .single import Single
from .tp import TP

REGISTRY: dict[str, type[Strategy]] = {
    "single": Single,
    "dp": DataParallel,
    "ddp": DDP,
    "fsdp": FSDP,
    "hvd": Horovod,
    "pipeline": Pipeline,
    "tp": TP,
}
NAMES = ("auto", *REGISTRY)

__all__ = [
    "BackwardSyncControl", "DDP", "DataParallel", "Distributed", "FSDP", "Horovod", "Pipeline", "PipelineSchedule",
    "PowerSGD", "REGISTRY", "Single", "StageData", "Strategy", "TP", "check_setup", "module_options", "resolve",
]


LEGACY_OPTIONS = ("stages", "microbatches", "schedule", "split_at", "compression")


def resolve(strategy: str | Strategy, env: Environment, *, init_method: str | None = None, **legacy: Any) -> Strategy:
    """The strategy object for ``strategy``: an object as given, a name with its class's defaults.

    ``"auto"``: DDP when launched with more than one process (or given an init_method), else Single.
    ``legacy``: Ring's keyword arguments from before strategies were objects (deprecated).
    """
    unknown = sorted(set(legacy) - set(LEGACY_OPTIONS))
    if unknown:
        raise TypeError(f"Ring() got an unexpected keyword argument {unknown[0]!r}")
    legacy = {k: v for k, v in legacy.items() if v is not None and not (k == "compression" and v == "none")}
    if isinstance(strategy, Strategy):
        if legacy:
            raise RingtrainError(f"Ring got {sorted(legacy)} beside a strategy object {strategy!r}",
                                 f"give those options to the strategy object itself, e.g. {type(strategy).__name__}(...).")
        return strategy
    if isinstance(strategy, type) and issubclass(strategy, Strategy):
        raise RingtrainError(f"Ring got the class {strategy.__name__}, not a strategy object",
                             f"call it: Ring(strategy=rt.strategies.{strategy.__name__}(...)).")
    if strategy not in NAMES:
        raise RingtrainError(f"unknown strategy {strategy!r}",
                             f"use one of {', '.join(NAMES)}, or an object such as rt.strategies.DDP(...).")
    if strategy == "auto":
        strategy = "ddp" if env.is_distributed or init_method is not None else "single"
    if legacy:
        return _from_legacy(strategy, legacy)
    if strategy == "pipeline":
        raise RingtrainError("strategy='pipeline' needs stages= and microbatches=",
                             "e.g. Ring(strategy=rt.strategies.Pipeline(stages=2, microbatches=8, schedule='1f1b')).")
    return REGISTRY[strategy]()


def _from_legacy(name: str, options: dict[str, Any]) -> Strategy:
    """``Ring(strategy="pipeline", stages=2, ...)`` / ``Ring(compression="fp16")``: still run, with a warning."""
    pipeline = {k: v for k, v in options.items() if k != "compression"}
    if pipeline and name != "pipeline":
        raise RingtrainError(f"Ring got pipeline options {sorted(pipeline)} with strategy={name!r}",
                             "use strategy=rt.strategies.Pipeline(stages=..., microbatches=..., schedule=..., split_at=...).")
    if name == "pipeline" and "compression" in options:
        raise RingtrainError("Ring got compression= with strategy='pipeline'",
                             "compression applies to strategy='ddp' or 'hvd' only.")
    if name == "pipeline" and not {"stages", "microbatches"} <= set(options):
        raise RingtrainError("strategy='pipeline' needs stages= and microbatches=",
                             "e.g. Ring(strategy=rt.strategies.Pipeline(stages=2, microbatches=8, schedule='1f1b')).")
    cls = {"pipeline": Pipeline, "ddp": DDP, "hvd": Horovod}.get(name)
    spelled = ", ".join(f"{k}={v!r}" for k, v in options.items())
    if cls is None:  # compression on one process: nothing travels, nothing to compress
        made: Strategy = REGISTRY[name]()
        advice = f"drop compression= (strategy {name!r} sends no gradients)"
    else:
        made = cls(**options)
        advice = f"write Ring(strategy=rt.strategies.{cls.__name__}({spelled}))"
    warnings.warn(f"Ring({spelled}) is deprecated: {advice}.", DeprecationWarning, stacklevel=4)
    return made


def check_setup(strategy: Strategy, model: Any, optimizer: Any, scheduler: Any, options: dict[str, Any]) -> None:
    """``ring.setup``'s arguments, checked before anything is moved or wrapped."""
    unknown = set(options) - module_options()
    if unknown:
        raise RingtrainError(f"ring.setup got unknown option(s) {sorted(unknown)}",
                             f"the options strategies take are {sorted(module_options())}.")
    if not isinstance(model, nn.Module):
        raise RingtrainError(f"ring.setup got a {type(model).__name__}, not an nn.Module", "pass your model.")
    from torch.distributed.fsdp import FSDPModule

    if strategy.unwrap(model) is not model or isinstance(model, (nn.DataParallel, DistributedDataParallel, FSDPModule)):
        raise RingtrainError(
            f"ring.setup got a model already wrapped in {type(model).__name__}",
            "pass the plain model: the ring wraps (or shards) it for the strategy it runs.",
        )
    if scheduler is not None and optimizer is None:
        raise RingtrainError("ring.setup got a scheduler without its optimizer", "pass ring.setup(model, optimizer, scheduler).")


def module_options() -> frozenset[str]:
    """Every keyword some strategy takes in ``ring.setup``: one script runs under any of them."""
    return frozenset().union(*(cls.MODULE_OPTIONS for cls in REGISTRY.values()))
