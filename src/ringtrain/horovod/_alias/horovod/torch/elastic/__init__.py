"""``horovod.torch.elastic`` -> ``ringtrain.horovod.elastic``."""

from .....elastic import *  # noqa: F401,F403
from .....elastic import __all__  # noqa: F401
