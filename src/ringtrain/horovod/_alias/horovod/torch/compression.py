"""``horovod.torch.compression`` -> ``ringtrain.horovod.compression``."""

from ....compression import *  # noqa: F401,F403
