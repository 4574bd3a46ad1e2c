"""``horovod.torch.optimizer`` -> ``ringtrain.horovod.optimizer``."""

from ringtrain.horovod.optimizer import *  # noqa: F401,F403
