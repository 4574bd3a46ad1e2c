"""The small contract every way of running implements.

Only what differs between strategies is abstract: which device, how the module
is wrapped, and whether collectives talk to other processes. Everything else has
a working default here. Optional abilities are mixins that code asks for with
``isinstance`` (DESIGN.md, principle 2) — never ``strategy.name == "ddp"``.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Any, ContextManager

import torch
from torch import nn

from .. import collectives
from ..environments import Environment


class Strategy(ABC):
    """How one process of the job runs: device, wrapping, communication."""

    name: str = "base"
    # Set by enable_collective_checks: every collective is first checked across ranks.
    checker: collectives.Checker | None = None

    def __init__(self, env: Environment):
        self.env = env

    # --- who and where -------------------------------------------------
    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def node_rank(self) -> int:
        return self.env.node_rank

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @property
    def devices_per_process(self) -> int:
        """How many devices one process drives (DataParallel drives several)."""
        return 1

    def setup_environment(self) -> None:
        """Claim the device and join the process group (nothing to do on one process)."""

    def teardown(self) -> None:
        """Leave the process group; safe to call twice."""

    def enable_collective_checks(self, timeout: float) -> None:
        """Check every collective across ranks first (nothing to check on one process)."""

    @property
    def data_parallel_rank(self) -> int:
        """Which shard of the data this process reads (pipeline stages of one replica share one)."""
        return self.rank

    @property
    def data_parallel_size(self) -> int:
        """How many different shards the data is cut into."""
        return self.world_size

    # --- model and optimizer --------------------------------------------
    def setup_module(self, module: nn.Module, precision: Any, **wrap_kwargs: Any) -> nn.Module:
        """Place ``module`` on the device, run its forward under ``precision``, wrap it.

        Moved before wrapping: DDP and DataParallel need the module on its device first.
        """
        module = module.to(self.device)
        precision.wrap_forward(module)
        return self.wrap_module(module, **wrap_kwargs)

    @abstractmethod
    def wrap_module(self, module: nn.Module, **wrap_kwargs: Any) -> nn.Module:
        """Return ``module`` (already on ``self.device``) ready for training."""

    def unwrap(self, module: nn.Module) -> nn.Module:
        """The user's module inside any wrapper this strategy added."""
        return module

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, module: nn.Module) -> torch.optim.Optimizer:
        """The optimizer for ``module`` as this strategy runs it (the same one, by default)."""
        return optimizer

    def sync_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Make this step's gradients final now (before clipping); DDP's already are after backward."""

    def step_context(self, optimizer: torch.optim.Optimizer) -> ContextManager:
        """The context the optimizer's real step runs in."""
        return contextlib.nullcontext()

    def clip_grad_norm_(self, module: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip ``module``'s gradients by their total norm; return that norm."""
        return torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm, norm_type=norm_type)

    # --- checkpoints: the user's unsplit, unwrapped state --------------------
    def module_state(self, module: nn.Module) -> Any:
        """``module``'s state dict as one process would hold it (collective for split models)."""
        return self.unwrap(module).state_dict()

    def load_module_state(self, module: nn.Module, state_dict: Any, path: str) -> None:
        from ..checkpoint import load_model_state

        load_model_state(self.unwrap(module), state_dict, path)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> Any:
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state_dict: Any) -> None:
        optimizer.load_state_dict(state_dict)

    # --- communication: identity on one process (collectives.py) ----------
    def all_reduce(self, x: Any, op: str = "mean") -> torch.Tensor:
        return collectives.all_reduce(x, op, self.checker)

    def all_gather(self, x: Any) -> torch.Tensor:
        return collectives.all_gather(x, self.checker)

    def gather_object(self, obj: Any) -> list[Any]:
        return collectives.gather_object(obj, self.checker)

    def broadcast(self, x: Any, src: int = 0) -> torch.Tensor:
        return collectives.broadcast(x, src, self.checker)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return collectives.broadcast_object(obj, src, self.checker)

    def barrier(self) -> None:
        collectives.barrier(self.checker)


class PipelineSchedule(ABC):
    """Mixin: the strategy runs forward and backward itself, micro-batch by micro-batch."""

    @abstractmethod
    def pipeline_step(self, x: Any, y: Any, loss_fn: Any, *, divisor: int = 1, sync: bool = True,
                      scaler: Any = None) -> torch.Tensor:
        """Forward and backward of one batch through the stages; its mean loss on every rank."""


class BackwardSyncControl:
    """Mixin: the strategy can skip gradient synchronisation for a backward pass."""

    def no_sync(self, module: nn.Module) -> ContextManager:
        return contextlib.nullcontext()
