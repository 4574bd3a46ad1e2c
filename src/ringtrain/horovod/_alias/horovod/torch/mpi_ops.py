"""``horovod.torch.mpi_ops`` -> ``ringtrain.horovod.mpi_ops``."""

from ringtrain.horovod.mpi_ops import *  # noqa: F401,F403
