"""``horovod.torch.optimizer`` -> ``ringtrain.horovod.optimizer``."""

from ....optimizer import *  # noqa: F401,F403
