"""``hvd.SyncBatchNorm``: ringtrain's SyncBatchNorm (which also works on CPU/Gloo) under Horovod's name."""

from __future__ import annotations

from ..parallel.syncbn import SyncBatchNorm as _RingSyncBatchNorm


class SyncBatchNorm(_RingSyncBatchNorm):
    """``SyncBatchNorm(num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True)``:
    Horovod's signature; statistics over every rank's batch (ringtrain.parallel.syncbn.SyncBatchNorm)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
