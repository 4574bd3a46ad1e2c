"""``horovod.runner`` -> ``ringtrain.launcher.horovod_run``: ``run`` (the function launcher)."""

from ringtrain.launcher.horovod_run import run  # noqa: F401
