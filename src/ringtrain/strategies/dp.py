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
from typing import Any, Sequence

import torch
from torch import nn

from ..errors import RingtrainError
from ..parallel import devices
from ..parallel.syncbn import SyncBatchNorm
from .base import Strategy


class DataParallel(Strategy):
    """``rt.strategies.DataParallel(device_ids=None)``: every visible GPU (or those listed) from one process."""

    name = "dp"

    def __init__(self, device_ids: Sequence[int] | None = None):
        super().__init__()
        if device_ids is not None and (not device_ids or not all(isinstance(i, int) and i >= 0 for i in device_ids)):
            raise RingtrainError(f"DataParallel got device_ids={device_ids!r}",
                                 "list GPU indices as torch sees them, e.g. device_ids=[0, 1], or leave it out.")
        self._requested_ids = list(device_ids) if device_ids is not None else None

    def check_job(self) -> None:
        if self.env.is_distributed:
            raise RingtrainError(
                f"strategy='dp' drives all GPUs from one process, but the launcher ({self.env.name}) started "
                f"{self.env.world_size} processes",
                "launch one process (python train.py) for dp, or use strategy='ddp' with several processes.",
            )
        gpus = devices.visible_gpus()
        devices.check_requested(self.device_request, gpus)
        use_cuda = self.device_request != "cpu" and gpus.count > 0
        ids = (self._requested_ids or list(range(gpus.count))) if use_cuda else []
        missing = [i for i in ids if i >= gpus.count]
        if missing:
            raise RingtrainError(f"DataParallel(device_ids={ids}) but torch sees {gpus.count} GPU(s)",
                                 "list only visible GPUs (CUDA_VISIBLE_DEVICES renumbers them from 0).")
        self.device_ids = ids
        self._device = torch.device("cuda", ids[0]) if ids else torch.device("cpu")
        if len(self.device_ids) < 2:
            warnings.warn(
                f"strategy='dp' found {len(self.device_ids) or 'no'} GPU(s): running on {self._device} "
                "without DataParallel (nothing to split across).",
                stacklevel=5,
            )

    def configure(self, *, accumulate: int = 1, nonfinite: str = "raise", sync_batchnorm: bool = False) -> None:
        if sync_batchnorm and len(self.device_ids) > 1:
            # nn.DataParallel replicates the module every step; SyncBatchNorm needs a process group
            # (one process per device), so under DP its statistics would silently stay per GPU.
            raise RingtrainError(
                "sync_batchnorm=True with strategy='dp': DataParallel's replicas cannot synchronise BatchNorm "
                "statistics (SyncBatchNorm works across processes, DP runs one)",
                "use strategy='ddp' (ringtrain run --nproc-per-node gpu) for synchronised BatchNorm, or drop "
                "sync_batchnorm.",
            )

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def devices(self) -> list[torch.device]:
        return [torch.device("cuda", i) for i in self.device_ids] if len(self.device_ids) > 1 else [self._device]

    def setup_environment(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)

    def wrap_module(self, module: nn.Module, **options: Any) -> nn.Module:
        if len(self.device_ids) < 2:
            return self.blocks.apply(module)
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
        # A compiled block keeps its compiled call bound to itself: DataParallel's replicas would all run the first.
        self.blocks.refuse_compile("strategy='dp' on several GPUs", "use strategy='ddp' for compile=True.")
        return nn.DataParallel(self.blocks.apply(module), device_ids=self.device_ids)

    def unwrap(self, module: nn.Module) -> nn.Module:
        return module.module if isinstance(module, nn.DataParallel) else module
