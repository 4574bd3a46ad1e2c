"""Checkpoint files that are whole or absent and load safely.

The file is an ordinary ``torch.save`` dict: one entry per keyword given to
``ring.save`` (``state_dict()`` of anything that has one, the value itself
otherwise) plus a ``"ringtrain"`` entry with every rank's RNG state and the
loaders' positions. ``torch.load(path)["model"]`` is a plain state dict any
PyTorch code can load.

Writing is atomic (temporary file in the same folder, flush + fsync, rename,
fsync of the folder: a crash leaves the old file or the new one, never half of
one). Tensors are written as CPU copies, so a checkpoint made on a GPU loads on
a machine without one. Reading uses ``weights_only=True``, so a checkpoint can
never run code, and loads onto the CPU: ``load_state_dict`` copies into the
parameters wherever they are, and RNG states must be CPU tensors anyway.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

from ..errors import RingtrainError, one_line
from .temporaries import os_error_in, remove_dead_temporaries, temporary, write_failed

META_KEY = "ringtrain"
FORMAT = 1


class DamagedCheckpoint(RingtrainError):
    """A checkpoint that is there but does not read back whole (truncated, zero-filled, bit-flipped): a resume
    sets it aside and takes the previous one."""


def state_of(value: Any) -> Any:
    return value.state_dict() if hasattr(value, "state_dict") and callable(value.state_dict) else value


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor inside dicts, lists and tuples replaced by a detached CPU copy.

    What ``ring.save`` writes: a file of CUDA tensors cannot be opened by plain
    ``torch.load`` on a machine without CUDA ("Attempting to deserialize object on a
    CUDA device"), which is where checkpoints are often inspected or served.
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        out = copy.copy(obj)  # keeps the type and attributes, e.g. a state dict's _metadata (versions)
        for key, value in obj.items():
            out[key] = to_cpu(value)
        return out
    if isinstance(obj, list):
        return [to_cpu(v) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(to_cpu(v) for v in obj)
    return obj


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to ``path`` so that it is either the old file or the complete new one.

    The temporary files of writers that died here (``kill -9`` mid-write) are removed first.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise RingtrainError(
            f"cannot save the checkpoint {path!r}: folder {folder!r} does not exist",
            "create the folder first (os.makedirs(folder, exist_ok=True)) or save elsewhere.",
        )
    try:
        remove_dead_temporaries(folder)
        fd, tmp = temporary(folder, os.path.basename(path))
    except OSError as e:
        raise write_failed("the checkpoint", path, e, "the file that was at that path, if any, is unchanged") from e
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        # The rename is durable only once the folder entry is on disk.
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if (refused := os_error_in(e)) is not None:
            raise write_failed("the checkpoint", path, refused, "the file that was at that path, if any, is unchanged") from e
        raise


def read(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint (onto the CPU unless told otherwise) without unpickling code.

    The CPU is the right place for every caller here: loading onto ``cuda:k`` would
    bring the saved RNG states back as CUDA tensors (numpy's cannot be restored from
    one) and an optimizer's ``step`` counters onto the GPU, where a foreach Adam then
    syncs the host for each of them every step; ``load_state_dict`` copies values to
    the parameters' device itself.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise RingtrainError(
            f"no checkpoint at {path!r}",
            "check the path; ring.save writes it on the main process only, so read it from a folder every rank sees.",
        )
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise DamagedCheckpoint(
            f"cannot read the checkpoint {path!r} ({one_line(e)})",
            "the file is damaged or was not written by torch.save; checkpoints that hold arbitrary Python "
            "objects cannot be loaded safely (weights_only=True) — save tensors, numbers, strings, lists and dicts.",
        ) from e
    if not isinstance(obj, dict):
        raise RingtrainError(
            f"the checkpoint {path!r} holds a {type(obj).__name__}, not a dict",
            "save with ring.save(path, model=model, ...) or torch.save(model.state_dict(), path).",
        )
    return obj
