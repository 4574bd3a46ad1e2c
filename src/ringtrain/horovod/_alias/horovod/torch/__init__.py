"""``horovod.torch`` -> ``ringtrain.horovod``: Horovod's PyTorch API on torch.distributed, nothing compiled."""

from ringtrain.horovod import *  # noqa: F401,F403
from ringtrain.horovod import (  # noqa: F401
    __all__,
    __version__,
    elastic,  # noqa: F401
)
