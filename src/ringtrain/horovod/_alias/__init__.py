"""Put this folder on PYTHONPATH and ``import horovod.torch as hvd`` resolves to ``ringtrain.horovod``.

``ringtrain run --horovod`` does that for its workers only; nothing named
``horovod`` is installed into site-packages. (This file only makes the folder part
of the ringtrain package, so it ships in wheels.)
"""
