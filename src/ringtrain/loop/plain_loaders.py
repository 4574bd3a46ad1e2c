"""A plain ``DataLoader`` under data parallelism: every rank reads the whole data set.

With DDP and a ``DataLoader`` made by the script (no ``DistributedSampler``), each of W ranks trains on all the
samples: an epoch is W times the work, the ranks' batches repeat each other, and nothing fails. The ring cannot see a
loader it did not make — except in the script's frame at the first ``ring.backward``, where the loop holding it runs.
A loader that shuffles is the training one; with none shuffling, only a lone loader is named (an evaluation loader
beside a ring loader is the script's choice, and the ring says nothing when it made a training loader itself).
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler

_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # src/ringtrain


def _user_frame() -> FrameType | None:
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_OWN + os.sep):
        frame = frame.f_back
    return frame


def _unsharded(loader: Any) -> bool:
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return False
    sampler = getattr(loader.batch_sampler, "sampler", None) or loader.sampler
    return not isinstance(sampler, DistributedSampler) and not hasattr(sampler, "num_replicas")


def plain_loader_warning(replicas: int, devices_per_process: int = 1) -> str | None:
    """The warning for a plain DataLoader in the calling script's frame, or None."""
    frame = _user_frame()
    if frame is None:
        return None
    scopes = [frame.f_locals] + ([frame.f_globals] if frame.f_globals is not frame.f_locals else [])
    found = {id(v): (name, v) for scope in scopes for name, v in list(scope.items()) if _unsharded(v)}
    shuffling = [(n, v) for n, v in found.values() if isinstance(v.sampler, RandomSampler)]
    chosen = shuffling[:1] or (list(found.values()) if len(found) == 1 else [])
    if not chosen:
        return None
    name, loader = chosen[0]
    n = len(loader.dataset) if hasattr(loader.dataset, "__len__") else None
    batch = loader.batch_size or 1
    per_rank = f"{len(loader)} steps per epoch on each rank" if n is not None else "all the steps on each rank"
    shard = f", instead of {-(-n // (batch * replicas))} with each rank reading 1/{replicas}" if n is not None else ""
    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    return (f"ringtrain: warning: the DataLoader `{name}` (seen at {where}, the first ring.backward) is not sharded: "
            f"each of the {replicas} "
            f"data-parallel ranks reads the whole data set ({per_rank}{shard}), so the ranks train on the same samples "
            f"and the global batch is {batch} x {replicas} of samples that repeat.\n"
            f"HINT: make it with `{name} = ring.loader(dataset, batch_size={batch // max(1, devices_per_process)}, "
            "shuffle=True)`: it shards per rank (DistributedSampler, set_epoch every epoch) and resumes mid-epoch.")


class PlainLoaders:
    """The ring's check, once at its first ``ring.backward``; nothing when it made a training loader itself."""

    def __init__(self, strategy: Any, held: Any, say: Any):
        self.strategy, self.held, self.say = strategy, held, say
        self.done = False

    def first_backward(self) -> None:
        if self.done:
            return
        self.done = True
        if self.strategy.data_parallel_size < 2 or any(not made.exact for made in self.held.loaders):
            return
        said = plain_loader_warning(self.strategy.data_parallel_size, self.strategy.devices_per_process)
        if said:
            self.say(said)
