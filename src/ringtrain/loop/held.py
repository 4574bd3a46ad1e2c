"""What a ring's loop holds: its step state and scaler, the models, optimizers and loaders it set up, and the
epoch it is in. The Ring writes it; what saves and resumes the loop (checkpoint/resume.py) reads it — one
object handed over, instead of callbacks into the Ring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .data import RingLoader
from .step import Step


@dataclass
class Held:
    step: Step
    scaler: torch.amp.GradScaler
    devices: int = 1  # data-parallel devices over the job (replicas x devices per process): the global batch's factor
    models: list[nn.Module] = field(default_factory=list)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    loaders: list[RingLoader] = field(default_factory=list)
    epoch: int | None = None  # the epoch ``ring.epochs`` is in, or None outside it
    _module_of: dict[int, nn.Module] = field(default_factory=dict)  # id(optimizer) -> the model it was set up with

    def add_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
        self.optimizers.append(optimizer)
        self._module_of[id(optimizer)] = model

    def module_of(self, optimizer: Any) -> nn.Module | None:
        """The model ``optimizer`` was set up with (its parameters' names), or None."""
        return self._module_of.get(id(optimizer))

    @property
    def global_batch(self) -> int | None:
        """Samples per optimizer step over the whole job: per-device batch x devices x accumulate, from the
        first training loader; None before there is one."""
        training = [made for made in self.loaders if not made.exact and made.per_device_batch]
        return training[0].per_device_batch * self.devices * self.step.k if training else None
