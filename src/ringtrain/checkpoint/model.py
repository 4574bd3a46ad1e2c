"""A model's state dict as the user's model names it: wrapper prefixes (``module.`` from DDP and DataParallel,
``_orig_mod.`` from torch.compile) removed, and a load that says which keys and shapes do not fit."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Mapping

import torch

from ..errors import RingtrainError

_WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP/DataParallel, torch.compile


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
