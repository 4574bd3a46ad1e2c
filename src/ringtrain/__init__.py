"""ringtrain: an ordinary single-device PyTorch script, trained on one device or many.

    import ringtrain as rt
    ring = rt.Ring(seed=0)
    model, optimizer = ring.setup(model, optimizer)
    train = ring.loader(train_set, batch_size=64, shuffle=True)
    for epoch in ring.epochs(10):
        for x, y in ring.progress(train):
            loss = F.cross_entropy(model(x), y)
            ring.backward(loss)
            optimizer.step(); optimizer.zero_grad()
        ring.save("ckpt.pt", model=model, optimizer=optimizer, epoch=epoch)

The public names are loaded on first use (PEP 562): ``import ringtrain`` itself imports
neither torch nor anything else, so the ``ringtrain`` command's ``--help`` is instant and
the launcher's worker entry can use ringtrain's torch-free modules (``ringtrain.liveness.failures``)
without importing torch before the user's script does (a script may set
``CUDA_VISIBLE_DEVICES`` before its own ``import torch``).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "Ring": "ringtrain.ring",
    "checkpoint_values": "ringtrain.checkpoint.sharded",
    "seed_everything": "ringtrain.loop.seeding",
    "RingtrainError": "ringtrain.errors",
    "launch": "ringtrain.launcher.spawn",
    "plan": "ringtrain.planning",
    "spawn": "ringtrain.launcher.spawn",
    "scale_lr": "ringtrain.loop.optim",
    "split": "ringtrain.parallel.stages",
    "SyncBatchNorm": "ringtrain.parallel.syncbn",
    "convert_sync_batchnorm": "ringtrain.parallel.syncbn",
    "revert_sync_batchnorm": "ringtrain.parallel.syncbn",
}
_SUBPACKAGES = ("strategies", "horovod", "comm", "bench", "launcher", "doctor")

__all__ = sorted(_EXPORTS) + ["strategies", "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"ringtrain.{name}")
    raise AttributeError(f"module 'ringtrain' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBPACKAGES))
