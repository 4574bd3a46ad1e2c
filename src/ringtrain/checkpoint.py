"""Checkpoints that are whole or absent, hold no wrapper prefixes, and load safely.

The file is an ordinary ``torch.save`` dict: one entry per keyword given to
``ring.save`` (``state_dict()`` of anything that has one, the value itself
otherwise) plus a ``"ringtrain"`` entry with every rank's RNG state and the
loaders' positions. ``torch.load(path)["model"]`` is a plain state dict any
PyTorch code can load.

Writing is atomic (temporary file in the same folder, flush + fsync, rename,
fsync of the folder: a crash leaves the old file or the new one, never half of
one). Reading uses ``weights_only=True``, so a checkpoint can never run code.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections import OrderedDict
from typing import Any, Mapping

import numpy as np
import torch

from .errors import RingtrainError

META_KEY = "ringtrain"
FORMAT = 1
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP/DataParallel, torch.compile


def state_of(value: Any) -> Any:
    return value.state_dict() if hasattr(value, "state_dict") and callable(value.state_dict) else value


def capture_rng() -> dict[str, Any]:
    """This process's RNG states as tensors and plain Python (safe for weights_only loading)."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "gauss": float(np_state[4]),
        },
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    np_state = state["numpy"]
    np.random.set_state(
        ("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"], np_state["has_gauss"], np_state["gauss"])
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda_states])


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to ``path`` so that it is either the old file or the complete new one."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise RingtrainError(
            f"cannot save the checkpoint {path!r}: folder {folder!r} does not exist",
            "create the folder first (os.makedirs(folder, exist_ok=True)) or save elsewhere.",
        )
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    # The rename is durable only once the folder entry is on disk.
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read(path: str | os.PathLike, device: torch.device) -> dict[str, Any]:
    """Load a checkpoint onto ``device`` without unpickling code."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise RingtrainError(
            f"no checkpoint at {path!r}",
            "check the path; ring.save writes it on the main process only, so read it from a folder every rank sees.",
        )
    try:
        obj = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        raise RingtrainError(
            f"cannot read the checkpoint {path!r} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
            "the file is damaged or was not written by torch.save; checkpoints that hold arbitrary Python "
            "objects cannot be loaded safely (weights_only=True) — save tensors, numbers, strings, lists and dicts.",
        ) from e
    if not isinstance(obj, dict):
        raise RingtrainError(
            f"the checkpoint {path!r} holds a {type(obj).__name__}, not a dict",
            "save with ring.save(path, model=model, ...) or torch.save(model.state_dict(), path).",
        )
    return obj


def strip_wrapper_prefixes(state_dict: Mapping[str, Any]) -> "OrderedDict[str, Any]":
    """Remove ``module.`` / ``_orig_mod.`` that wrappers put in front of every key."""
    out: OrderedDict[str, Any] = OrderedDict()
    for key, value in state_dict.items():
        changed = True
        while changed:
            changed = False
            for prefix in _WRAPPER_PREFIXES:
                if key.startswith(prefix):
                    key, changed = key[len(prefix) :], True
        out[key] = value
    return out


def is_plain_state_dict(obj: Mapping[str, Any]) -> bool:
    return bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def load_model_state(model: torch.nn.Module, state_dict: Mapping[str, Any], path: str) -> None:
    """``load_state_dict`` with wrapper prefixes removed and a readable error on mismatch."""
    state_dict = strip_wrapper_prefixes(state_dict)
    own = model.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    wrong_shape = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in state_dict and isinstance(state_dict[k], torch.Tensor) and state_dict[k].shape != own[k].shape
    ]
    if missing or unexpected or wrong_shape:
        def show(items: list[str]) -> str:
            return ", ".join(items[:8]) + (f" (+{len(items) - 8} more)" if len(items) > 8 else "") or "none"

        raise RingtrainError(
            f"the checkpoint {path!r} does not fit {type(model).__name__}: missing keys: {show(missing)}; "
            f"unexpected keys: {show(unexpected)}; shape mismatches: {show(wrong_shape)}",
            "load it into the same model architecture it was saved from (same constructor arguments).",
        )
    model.load_state_dict(state_dict)


class CheckpointDir:
    """A folder of periodic checkpoints: the last ``keep_last`` complete ones and a manifest.

    A checkpoint counts only once the manifest lists it, and the manifest is
    rewritten atomically *after* the checkpoint file is on disk — so a crash at
    any moment leaves the previous complete checkpoint as the latest one, never
    a partial file. Only the main process writes here.
    """

    MANIFEST = "manifest.json"

    def __init__(self, folder: str | os.PathLike, keep_last: int = 3):
        if not isinstance(keep_last, int) or keep_last < 1:
            raise RingtrainError(f"Ring got keep_last={keep_last!r}", "keep at least 1 checkpoint.")
        self.folder = os.fspath(folder)
        self.keep_last = keep_last

    def prepare(self) -> None:
        """Create the folder and remove what a crash left behind (main process): temporary
        files, and checkpoints the manifest does not list (written but never committed, or
        dropped from the manifest but not yet deleted)."""
        os.makedirs(self.folder, exist_ok=True)
        listed = {e["file"] for e in self._entries()}
        for name in os.listdir(self.folder):
            stale = name.startswith(".") and name.endswith(".tmp")
            orphan = name.startswith("step-") and name.endswith(".pt") and name not in listed
            if stale or orphan:
                os.unlink(os.path.join(self.folder, name))

    def _entries(self) -> list[dict[str, Any]]:
        path = os.path.join(self.folder, self.MANIFEST)
        if not os.path.isfile(path):
            return []
        try:
            with open(path) as f:
                entries = json.load(f)["checkpoints"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise RingtrainError(
                f"the checkpoint manifest {path!r} is unreadable ({type(e).__name__}: {e})",
                "it is only ever replaced atomically, so something else wrote it: restore it or delete the folder.",
            ) from e
        return [e for e in entries if os.path.isfile(os.path.join(self.folder, e["file"]))]

    def latest(self) -> str | None:
        """Path of the newest complete checkpoint, or None."""
        entries = self._entries()
        return os.path.join(self.folder, entries[-1]["file"]) if entries else None

    def path_for(self, step: int) -> str:
        return os.path.join(self.folder, f"step-{step:09d}.pt")

    def commit(self, path: str, **info: Any) -> None:
        """Record ``path`` (already written) as the newest checkpoint; drop the oldest beyond keep_last."""
        name = os.path.basename(path)
        entries = [e for e in self._entries() if e["file"] != name] + [{"file": name, **info}]
        keep, drop = entries[-self.keep_last :], entries[: -self.keep_last]
        manifest = os.path.join(self.folder, self.MANIFEST)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.MANIFEST}.", suffix=".tmp", dir=self.folder)
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "checkpoints": keep}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, manifest)
        for entry in drop:
            stale = os.path.join(self.folder, entry["file"])
            if os.path.exists(stale):
                os.unlink(stale)
