"""``horovod.torch`` -> ``ringtrain.horovod``: Horovod's PyTorch API on torch.distributed, nothing compiled."""

from ringtrain.horovod import *  # noqa: F401,F403
from ringtrain.horovod import __all__, __version__  # noqa: F401
from ringtrain.horovod import elastic  # noqa: F401
