"""``horovod.torch`` -> ``ringtrain.horovod``: Horovod's PyTorch API on torch.distributed, nothing compiled."""

from .... import *  # noqa: F401,F403
from .... import (  # noqa: F401
    __all__,
    __version__,
    elastic,  # noqa: F401
)
