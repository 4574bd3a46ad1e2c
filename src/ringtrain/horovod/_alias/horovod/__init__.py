"""``horovod``, as provided by ringtrain for unmodified Horovod scripts (see ``ringtrain.horovod``).

``horovod.run(fn, args=(), kwargs=None, np=N, ...)`` is ringtrain's (ringtrain/launcher/horovod_run.py): torch is
imported when it is called, not here.
"""

from ringtrain.launcher.horovod_run import run  # noqa: F401  (horovod/__init__.py: `from horovod.runner import run`)

__version__ = "0.28.1"
