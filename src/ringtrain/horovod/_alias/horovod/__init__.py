"""``horovod``, as provided by ringtrain for unmodified Horovod scripts (see ``ringtrain.horovod``).

``horovod.run(fn, args=(), kwargs=None, np=N, ...)`` is ringtrain's (ringtrain/horovod/runner.py): torch is
imported when it is called, not here.
"""

from ringtrain.horovod.runner import run  # noqa: F401  (horovod/__init__.py: `from horovod.runner import run`)

__version__ = "0.28.1"
