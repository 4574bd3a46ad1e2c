"""A sharded (FSDP) run that keeps three checkpoints, and its resume after one of them was poisoned, for
tests/checkpoint/test_metadata_poison.py (importable by the ranks)."""

from __future__ import annotations

import os
import pathlib

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import ringtrain as rt
from _ring_jobs import regression_data, small_model


def watched_classes() -> list[type]:
    """What the exact-name unpickler of ``.metadata`` handed to pickle before issue 37: pathlib's classes and
    DCP's metadata classes (a BUILD with slot state ``setattr``s on a class for the whole process)."""
    from torch.distributed.checkpoint import filesystem, metadata

    return [pathlib.PurePath, pathlib.PurePosixPath, pathlib.Path, pathlib.PosixPath, metadata.Metadata,
            metadata.ChunkStorageMetadata, metadata.TensorProperties, metadata.TensorStorageMetadata,
            metadata.BytesStorageMetadata, metadata.StorageMeta, metadata.MetadataIndex,
            metadata._MEM_FORMAT_ENCODING, filesystem._StorageInfo]


def snapshot() -> dict[str, dict]:
    """Each watched class's attributes; but ``__slotnames__``, which pickle's own ``copyreg`` caches on a class the
    first time it pickles one of its objects (a save does)."""
    return {cls.__qualname__: {k: v for k, v in vars(cls).items() if k != "__slotnames__"}
            for cls in watched_classes()}


def changed_since(before: dict[str, dict]) -> list[str]:
    """The watched classes whose attributes differ from ``before`` (added, removed or replaced)."""
    now = snapshot()
    return [name for name, attrs in before.items()
            if attrs.keys() != now[name].keys() or any(now[name][k] is not v for k, v in attrs.items())]


def train(folder: str, until: int, keep_last: int = 3) -> dict:
    """FSDP on every rank, a sharded checkpoint every 2 steps into ``folder`` (resuming from it when it holds
    one); trains until optimizer step ``until`` (its checkpoint written by ``ring.close``). Rank 0 returns what the resume saw: the step resumed at, the
    whole model state right after ``ring.setup`` (the resumed weights), and the watched classes that changed in
    this process meanwhile; and whether ``open(Path(...))`` still works at the end."""
    before = snapshot()
    ring = rt.Ring(strategy="fsdp", seed=0, checkpoint_dir=folder, save_every=2, keep_last=keep_last)
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = ring.setup(model, optimizer)
    resumed_at = ring.optimizer_steps
    state = ring.strategy.module_state(model)
    changed = changed_since(before)
    n = 40
    data = TensorDataset(regression_data(n).tensors[0], regression_data(n).tensors[1])
    loader = ring.loader(data, batch_size=4, shuffle=True)
    for _ in ring.epochs(10):  # 5 steps an epoch on 2 ranks
        for x, y in loader:
            ring.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            if ring.optimizer_steps == until:
                break
        if ring.optimizer_steps == until:
            break
    steps, rank = ring.optimizer_steps, ring.rank
    ring.close()
    probe = pathlib.Path(folder) / "manifest.json"
    with open(probe) as f:  # what the poisoned __fspath__ broke everywhere in the process
        f.read(1)
    return {"rank": rank, "resumed_at": resumed_at, "state": state, "changed": changed, "steps": steps,
            "fspath": os.fspath(probe)}
