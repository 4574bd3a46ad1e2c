"""``horovod``, as provided by ringtrain for unmodified Horovod scripts (see ``ringtrain.horovod``)."""

__version__ = "0.28.1"
