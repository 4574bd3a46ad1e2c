"""``horovod.torch.elastic`` -> ``ringtrain.horovod.elastic``."""

from ringtrain.horovod.elastic import *  # noqa: F401,F403
from ringtrain.horovod.elastic import __all__  # noqa: F401
