"""``horovod.torch.functions`` -> ``ringtrain.horovod.functions``."""

from ringtrain.horovod.functions import *  # noqa: F401,F403
