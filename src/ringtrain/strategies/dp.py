"""DataParallel: one process drives every visible GPU with ``nn.DataParallel``.

``ring.loader``'s ``batch_size`` still means samples per device, so the loader
yields ``batch_size x n_gpus`` and DataParallel scatters one slice to each GPU —
the same global batch DDP with one process per GPU would see. DDP is faster
(no per-step replication, no GIL contention); DP is here for comparison and for
scripts that cannot start several processes. Without GPUs it runs on the one
device there is and says so once.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from ..environments import Environment
from ..errors import RingtrainError
from .base import Strategy


class DataParallelStrategy(Strategy):
    name = "dp"

    def __init__(self, env: Environment, device: str = "auto"):
        super().__init__(env)
        if env.is_distributed:
            raise RingtrainError(
                f"strategy='dp' drives all GPUs from one process, but the launcher ({env.name}) started "
                f"{env.world_size} processes",
                "launch one process (python train.py) for dp, or use strategy='ddp' with several processes.",
            )
        use_cuda = device != "cpu" and torch.cuda.is_available()
        self.device_ids = list(range(torch.cuda.device_count())) if use_cuda else []
        self._device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
        if len(self.device_ids) < 2:
            warnings.warn(
                f"strategy='dp' found {len(self.device_ids) or 'no'} GPU(s): running on {self._device} "
                "without DataParallel (nothing to split across).",
                stacklevel=4,
            )

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def devices_per_process(self) -> int:
        return max(len(self.device_ids), 1)

    def setup_environment(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)

    def wrap_module(self, module: nn.Module, **wrap_kwargs: Any) -> nn.Module:
        if len(self.device_ids) < 2:
            return module
        from ..syncbn import SyncBatchNorm

        synced = [name for name, m in module.named_modules() if isinstance(m, (SyncBatchNorm, nn.SyncBatchNorm))]
        if synced:
            # Refused rather than warned: DataParallel's replicas are threads of one process
            # with no peers to exchange statistics with, so each GPU would normalise with its
            # own slice's statistics — exactly what sync_batchnorm=True asked to avoid — and a
            # warning scrolls away while the run trains differently from what was asked.
            raise RingtrainError(
                f"strategy='dp' cannot synchronise BatchNorm across its {len(self.device_ids)} GPUs "
                f"(found SyncBatchNorm at {', '.join(n or '<model>' for n in synced[:4])}"
                f"{' ...' if len(synced) > 4 else ''}): DataParallel keeps per-GPU statistics",
                "use strategy='ddp' (ringtrain run --nproc-per-node N train.py) for synchronised BatchNorm, "
                "or drop sync_batchnorm=True to train with per-GPU statistics.",
            )
        return nn.DataParallel(module, device_ids=self.device_ids)

    def unwrap(self, module: nn.Module) -> nn.Module:
        return module.module if isinstance(module, nn.DataParallel) else module
