"""A run's configuration, as every checkpoint records it, and how two of them differ.

Resuming from a folder whose checkpoints another configuration wrote (a changed learning rate, a
bigger model, another optimizer, another batch) would silently continue the old run's state under
the new settings — or the new settings under the old state. Every ring checkpoint therefore holds
the configuration its run was set up with::

    {"entries": {"model": {"kind": "module", "parameters": {"0.weight": [16, 10], ...}},
                 "optimizer": {"kind": "optimizer", "class": "SGD",
                               "groups": [{"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0, ...}]}},
     "world_size": 2, "global_batch": 8}

taken when ``ring.setup`` sees the objects — before a resume loads anything, and before a learning
rate scheduler has moved the rate (its base rate, ``initial_lr``, is what is recorded) — so the
same script gives the same fingerprint at every restart. Parameter shapes are the unsplit model's
(a shard's global shape; a pipeline's stages united). Only plain values go in (numbers, strings,
lists): checkpoints are read with ``weights_only=True``.

``differences`` lists what changed in words; the Resumer decides what to do with them
(``Ring(resume=...)``). A world-size change alone is not one: checkpoints load at any world size.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch

from . import files, sharded

# Optimizer options that choose an implementation, not the arithmetic: changing them is not a new run.
_IMPLEMENTATION = {"params", "initial_lr", "foreach", "fused", "differentiable", "capturable"}
_MISSING = "(none)"


def _plain(value: Any) -> Any:
    """``value`` as a plain, comparable value (a one-element tensor as its number); None when it has none."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, (bool, int, float)) for v in value):
        return [v for v in value]
    return None


def of_module(shapes: Mapping[str, Any]) -> dict[str, Any]:
    """A model's fingerprint from its parameters' unsplit names and global shapes."""
    return {"kind": "module", "parameters": {name: [int(n) for n in shape] for name, shape in shapes.items()}}


def of_optimizer(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An optimizer's class (torch's, not a wrapper's) and each parameter group's hyperparameters."""
    cls = next((c for c in type(optimizer).__mro__ if not c.__module__.startswith("ringtrain")), type(optimizer))
    groups = []
    for group in optimizer.param_groups:
        options = {key: _plain(value) for key, value in group.items() if key not in _IMPLEMENTATION}
        options["lr"] = _plain(group.get("initial_lr", group.get("lr")))  # a scheduler's base rate
        groups.append({key: value for key, value in sorted(options.items()) if value is not None or group.get(key) is None})
    return {"kind": "optimizer", "class": cls.__name__, "groups": groups}


def saved_in(path: str) -> dict[str, Any] | None:
    """The fingerprint a checkpoint (file or sharded folder) holds; None for one written before fingerprints.
    A file's tensors are memory-mapped, not read: only its small meta entry is looked at."""
    if os.path.isdir(path):
        meta = files.read(os.path.join(path, sharded.INFO)).get("meta")
    else:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # an older, non-zip file: read it whole (it was read back whole already)
            obj = files.read(path)
        meta = obj.get(files.META_KEY) if isinstance(obj, dict) else None
    found = meta.get("fingerprint") if isinstance(meta, dict) else None
    return found if isinstance(found, dict) else None


def _show(names: list[str]) -> str:
    return ", ".join(names[:8]) + (f" (+{len(names) - 8} more)" if len(names) > 8 else "")


def _module_differences(name: str, saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    before, after = saved.get("parameters", {}), now.get("parameters", {})
    lines = []
    if gone := [k for k in before if k not in after]:
        lines.append(f"{name}: parameters only in the checkpoint: {_show(gone)}")
    if new := [k for k in after if k not in before]:
        lines.append(f"{name}: parameters only in this run: {_show(new)}")
    reshaped = [f"{k} {tuple(before[k])} -> {tuple(after[k])}" for k in after if k in before and before[k] != after[k]]
    if reshaped:
        lines.append(f"{name}: parameter shapes: {_show(reshaped)}")
    return lines


def _optimizer_differences(name: str, saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    lines = []
    if saved.get("class") != now.get("class"):
        lines.append(f"{name}: {saved.get('class')} -> {now.get('class')}")
    before, after = saved.get("groups", []), now.get("groups", [])
    if len(before) != len(after):
        lines.append(f"{name}: {len(before)} parameter group(s) -> {len(after)}")
    for index, (old, new) in enumerate(zip(before, after)):
        where = f"{name} group {index}" if len(after) > 1 else name
        changed = [f"{key} {old.get(key, _MISSING)} -> {new.get(key, _MISSING)}"
                   for key in sorted(set(old) | set(new)) if old.get(key, _MISSING) != new.get(key, _MISSING)]
        if changed:
            lines.append(f"{where}: {', '.join(changed)}")
    return lines


def differences(saved: Mapping[str, Any], now: Mapping[str, Any], names: list[str]) -> list[str]:
    """What differs between the checkpoint's configuration and this run's, for the entries ``names``
    (the models and optimizers ``ring.setup`` was given); one line per difference."""
    lines = []
    saved_entries, now_entries = saved.get("entries", {}), now.get("entries", {})
    for name in names:
        old, new = saved_entries.get(name), now_entries.get(name)
        if old is None or new is None:
            continue  # not in the checkpoint: loading it is refused by name, with the entries it has
        if old.get("kind") != new.get("kind"):
            lines.append(f"{name}: a {old.get('kind')} in the checkpoint, a {new.get('kind')} in this run")
        elif new["kind"] == "module":
            lines += _module_differences(name, old, new)
        elif new["kind"] == "optimizer":
            lines += _optimizer_differences(name, old, new)
    return lines


def batch_difference(saved: Mapping[str, Any], world_size: int, global_batch: int | None) -> tuple[str | None, bool]:
    """(the line saying how the global batch changed, or None; whether it follows a world-size change —
    the same per-device batch on another number of devices, which resuming at any world size allows)."""
    before = saved.get("global_batch")
    if before is None or global_batch is None or before == global_batch:
        return None, False
    resized = saved.get("world_size") not in (None, world_size)
    return f"global batch {before} -> {global_batch}", resized
