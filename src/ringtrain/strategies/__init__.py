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

import functools
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..comm.powersgd import PowerSGD
from ..errors import RingtrainError
from ..parallel.environments import Environment
from .base import BackwardSyncControl, Distributed, PipelineSchedule, StageData, Strategy
from .checkpointing import Checkpointing, apply_activation_checkpointing
from .compiling import Compile, apply_compile
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
    "BackwardSyncControl", "Checkpointing", "Compile", "DDP", "DataParallel", "Distributed", "FSDP", "Horovod",
    "Pipeline", "PipelineSchedule",
    "PowerSGD", "REGISTRY", "Single", "StageData", "Strategy", "TP", "apply_activation_checkpointing", "apply_compile",
    "check_setup", "module_options", "resolve",
]


# Ring's keywords from ringtrain 0.1, before strategies were objects, and the strategy each moved to.
MOVED = {"stages": "Pipeline", "microbatches": "Pipeline", "schedule": "Pipeline", "split_at": "Pipeline",
         "compression": "DDP"}


class MovedKeyword(RingtrainError, TypeError):
    """``Ring(stages=2)``: a keyword that moved onto a strategy object (a TypeError too, as any unknown keyword)."""


def refusing_moved_keywords(init: Any) -> Any:
    """``Ring.__init__`` (its own signature, no ``**kwargs``), refusing a moved keyword with its new spelling."""

    @functools.wraps(init)
    def checked(ring: Any, *args: Any, **keywords: Any) -> None:
        if moved := [k for k in keywords if k in MOVED]:
            raise moved_keyword_error(moved, keywords, args[0] if args else keywords.get("strategy", "auto"))
        init(ring, *args, **keywords)

    return checked


def moved_keyword_error(moved: list[str], given: dict[str, Any], strategy: Any) -> MovedKeyword:
    """``Ring(stages=2, microbatches=4)`` -> ``rt.strategies.Pipeline(stages=2, microbatches=4)``."""
    by_class: dict[str, list[str]] = {}
    for k in moved:
        cls = "Horovod" if MOVED[k] == "DDP" and (strategy == "hvd" or isinstance(strategy, Horovod)) else MOVED[k]
        by_class.setdefault(cls, []).append(f"{k}={given[k]!r}")
    new = [f"rt.strategies.{cls}({', '.join(kw)})" for cls, kw in by_class.items()]
    old = ", ".join(f"{k}=" for k in moved)
    return MovedKeyword(f"Ring() got {old}: {'these options' if len(moved) > 1 else 'this option'} of ringtrain 0.1 moved "
                        "onto the strategy object", f"write Ring(strategy={new[0]})." if len(new) == 1 else
                        f"give them to the strategy objects: {' and '.join(new)}.")


def resolve(strategy: str | Strategy, env: Environment, *, init_method: str | None = None) -> Strategy:
    """The strategy object for ``strategy``: an object as given, a name with its class's defaults.

    ``"auto"``: DDP when launched with more than one process (or given an init_method), else Single.
    """
    if isinstance(strategy, Strategy):
        return strategy
    if isinstance(strategy, type) and issubclass(strategy, Strategy):
        raise RingtrainError(f"Ring got the class {strategy.__name__}, not a strategy object",
                             f"call it: Ring(strategy=rt.strategies.{strategy.__name__}(...)).")
    if strategy not in NAMES:
        raise RingtrainError(f"unknown strategy {strategy!r}",
                             f"use one of {', '.join(NAMES)}, or an object such as rt.strategies.DDP(...).")
    if strategy == "auto":
        strategy = "ddp" if env.is_distributed or init_method is not None else "single"
    if strategy == "pipeline":
        raise RingtrainError("strategy='pipeline' needs stages= and microbatches=",
                             "e.g. Ring(strategy=rt.strategies.Pipeline(stages=2, microbatches=8, schedule='1f1b')).")
    return REGISTRY[strategy]()


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
