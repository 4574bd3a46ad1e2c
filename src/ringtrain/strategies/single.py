"""One process, one device: the script as the user wrote it."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..environments import Environment
from .base import Strategy


def default_device(local_rank: int = 0, requested: str = "auto") -> torch.device:
    """``cuda:local_rank`` when a GPU is there (or asked for), else the CPU."""
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", local_rank)


class SingleDevice(Strategy):
    name = "single"

    def __init__(self, env: Environment, device: str = "auto"):
        super().__init__(env)
        self._device = default_device(0, device)

    @property
    def device(self) -> torch.device:
        return self._device

    def setup_environment(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)

    def wrap_module(self, module: nn.Module, **wrap_kwargs: Any) -> nn.Module:
        return module
