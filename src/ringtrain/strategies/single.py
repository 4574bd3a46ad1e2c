"""One process, one device: the script as the user wrote it."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import RingtrainError
from ..parallel import devices
from .base import Strategy


class Single(Strategy):
    """``rt.strategies.Single()``: this process alone, on ``cuda:0`` when there is a GPU, else the CPU."""

    name = "single"

    def check_job(self) -> None:
        if self.env.is_distributed:
            raise RingtrainError(
                f"strategy='single' was asked for, but the launcher ({self.env.name}) started {self.env.world_size} "
                "processes: each would train its own copy on all the data",
                "use strategy='auto' or 'ddp', or launch one process (python train.py).",
            )
        self._device = devices.default_device(self.device_request)

    @property
    def device(self) -> torch.device:
        return self._device

    def setup_environment(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)

    def wrap_module(self, module: nn.Module, **options: Any) -> nn.Module:
        return self.blocks.apply(module)
