"""``hvd.SyncBatchNorm``: ringtrain's SyncBatchNorm (which also works on CPU/Gloo) under Horovod's name."""

from __future__ import annotations

from torch import nn

from ..errors import RingtrainError


def _implementation():
    import ringtrain

    impl = getattr(ringtrain, "SyncBatchNorm", None)
    if impl is None:
        raise RingtrainError(
            "hvd.SyncBatchNorm needs ringtrain.SyncBatchNorm, which this ringtrain version does not have yet",
            "use torch.nn.SyncBatchNorm on CUDA/NCCL, or a ringtrain release with SyncBatchNorm.",
        )
    return impl


class SyncBatchNorm(nn.Module):
    """``SyncBatchNorm(num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True)``.

    Constructing it returns ringtrain's implementation (statistics over all ranks' batches).
    """

    def __new__(cls, *args, **kwargs):
        return _implementation()(*args, **kwargs)
