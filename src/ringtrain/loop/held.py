"""What a ring's loop holds: its step state and scaler, the models, optimizers and loaders it set up, and the
epoch it is in. The Ring writes it; what saves and resumes the loop (checkpoint/resume.py) reads it — one
object handed over, instead of callbacks into the Ring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import RingtrainError
from .data import RingLoader
from .step import Step


@dataclass
class Held:
    step: Step
    scaler: torch.amp.GradScaler
    devices: int = 1  # data-parallel devices over the job (replicas x devices per process): the global batch's factor
    stages: int = 1  # processes one replica spans (a pipeline's stages, all working on the replica's samples)
    models: list[nn.Module] = field(default_factory=list)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    loaders: list[RingLoader] = field(default_factory=list)
    epoch: int | None = None  # the epoch ``ring.epochs`` is in, or None outside it
    nonfinite: Any = None  # the ring's NonFiniteGuard: a checkpoint never saves what a NaN step produced
    extras: dict[str, Any] = field(default_factory=dict)  # the script's own values every checkpoint carries
    preemption: Any = None  # loop/preempt.Preemption: a ring with a checkpoint_dir answers SIGTERM with one
    _module_of: dict[int, nn.Module] = field(default_factory=dict)  # id(optimizer) -> the model it was set up with

    def add_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
        self.optimizers.append(optimizer)
        self._module_of[id(optimizer)] = model

    def module_of(self, optimizer: Any) -> nn.Module | None:
        """The model ``optimizer`` was set up with (its parameters' names), or None."""
        return self._module_of.get(id(optimizer))

    @staticmethod
    def check_global_batch(value: Any) -> int | None:
        """``Ring(global_batch=...)``: None, or a positive number of samples."""
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise RingtrainError(f"Ring got global_batch={value!r}",
                                 "global_batch is the number of samples per optimizer step over the job, or None.")
        return value

    def accumulate_for(self, global_batch: int, per_device: int) -> int:
        """``Ring(global_batch=...)``: the micro-batches per step that make it, from the per-device batch."""
        k, left = divmod(global_batch, per_device * self.devices)
        if left or k < 1:
            raise RingtrainError(
                f"Ring(global_batch={global_batch}) is not a whole number of steps of {per_device} per device x "
                f"{self.devices} device(s) = {per_device * self.devices}",
                f"choose global_batch as a multiple of {per_device * self.devices}, or another per-device batch size.")
        return k

    def batch_terms(self, batch_size: int) -> str:
        """What a step's batch is made of: per device x devices, or — where a replica spans several processes (a
        pipeline's stages) — per replica x replicas (issue 33, item 2: 2 stages on 2 processes printed "32 per device
        x 1 device(s)": the number was right, the words were not)."""
        if self.stages > 1:
            return (f"{batch_size} per replica x {self.devices} replica(s) (each a pipeline of {self.stages} stages, "
                    "one process each)")
        return f"{batch_size} per device x {self.devices} device(s)"

    @property
    def global_batch(self) -> int | None:
        """Samples per optimizer step over the whole job: per-device batch x devices x accumulate, from the
        first training loader; None before there is one."""
        training = [made for made in self.loaders if not made.exact and made.per_device_batch]
        return training[0].per_device_batch * self.devices * self.step.k if training else None
