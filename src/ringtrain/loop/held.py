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
from .batches import DrawnBatches
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
    extras: dict[str, Any] = field(default_factory=dict)  # the script's own values every checkpoint carries, per rank
    kept: dict[str, Any] = field(default_factory=dict)  # ring.keep: objects whose state_dict rides along, per rank
    batches: list[DrawnBatches] = field(default_factory=list)  # ring.batches: draws whose held batches ride along
    preemption: Any = None  # loop/preempt.Preemption: a ring with a checkpoint_dir answers SIGTERM with one
    _module_of: dict[int, nn.Module] = field(default_factory=dict)  # id(optimizer) -> the model it was set up with

    def add_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
        self.optimizers.append(optimizer)
        self._module_of[id(optimizer)] = model

    def keep(self, obj: Any, name: str | None) -> str:
        """``ring.keep(obj)``: its state rides in every checkpoint under ``name`` (default: its class and number)."""
        for method in ("state_dict", "load_state_dict"):
            if not callable(getattr(obj, method, None)):
                raise RingtrainError(
                    f"ring.keep got a {type(obj).__name__}, which has no {method}()",
                    "give the object state_dict() (what resumes it: a position, a shard number) and "
                    "load_state_dict(state); or keep plain values in ring.extras.")
        if any(held is obj for held in self.kept.values()):
            raise RingtrainError(f"ring.keep got the same {type(obj).__name__} twice", "keep each object once.")
        if name is None:
            name = f"{type(obj).__name__}-{len(self.kept)}"
        if not isinstance(name, str) or not name or name in self.kept:
            raise RingtrainError(f"ring.keep got name={name!r}, " + ("which is taken" if name in self.kept else
                                 "which is not a non-empty string"), "give each kept object a name of its own.")
        self.kept[name] = obj
        return name

    def add_model(self, wrapped: nn.Module, inner: nn.Module) -> None:
        """A model ``ring.setup`` made; its forward (the wrapper's or the plain module's) tells ``ring.batches`` that
        what was drawn before it is used."""
        self.models.append(wrapped)
        for module in {id(m): m for m in (wrapped, inner)}.values():
            module.register_forward_pre_hook(self.forward_ran)

    def forward_ran(self, *_: Any) -> None:
        """A forward pre-hook on the ring's models: what ring.batches drew before it is used."""
        for drawn in self.batches:
            drawn.forward_ran()

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
        pipeline's stages) — per replica x replicas (2 stages on 2 processes printed "32 per device
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
