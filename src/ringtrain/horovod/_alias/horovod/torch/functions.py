"""``horovod.torch.functions`` -> ``ringtrain.horovod.functions``."""

from ....functions import *  # noqa: F401,F403
