"""``horovod.runner`` -> ``ringtrain.horovod.runner``: ``run`` (the function launcher)."""

from ringtrain.horovod.runner import run  # noqa: F401
