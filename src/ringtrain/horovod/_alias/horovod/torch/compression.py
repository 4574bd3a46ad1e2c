"""``horovod.torch.compression`` -> ``ringtrain.horovod.compression``."""

from ringtrain.horovod.compression import *  # noqa: F401,F403
