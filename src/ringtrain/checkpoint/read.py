"""Reading a sharded checkpoint folder into a ring's objects, each rank the pieces its own layout holds (a DTensor
shard, a pipeline stage, the whole tensor), and naming what does not fit."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import RingtrainError
from . import sharded, state


def read_sharded(strategy: Any, path: str, targets: dict[str, Any], params: dict[str, dict[str, Any]]
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """A sharded folder read into ``targets`` as this rank's layout holds them (``strategy``'s local state; an
    optimizer's parameters by name in ``params``): (the saved tree with tensors filled in, the run's meta). A model
    that does not fit is named with its missing, unexpected and differently shaped entries."""
    local = {name: strategy.local_state(t) for name, t in targets.items() if isinstance(t, nn.Module)}
    unexpected: dict[str, list[str]] = {}

    def target_for(key: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        name, _, rest = key.partition("/")
        if name in local:
            mine = local[name].get(rest)
            if mine is None:
                if rest not in strategy.state_keys(targets[name]):
                    unexpected.setdefault(name, []).append(rest)
                return None
            if state.global_shape(mine) != shape:
                raise RingtrainError(
                    f"the checkpoint {path!r} does not fit {type(targets[name]).__name__}: {rest}: checkpoint "
                    f"{shape} vs model {state.global_shape(mine)}",
                    "load it into the same model architecture it was saved from (same constructor arguments).")
            return mine
        if name in params:
            _, param_name, key_ = (rest.split("/", 2) + ["", ""])[:3] if rest.startswith("state/") else ("", "", "")
            param = params[name].get(param_name)
            if param is None:
                return None  # not held here (another stage's), or not this optimizer's
            if shape == state.global_shape(param) and key_ != "step":
                return torch.empty_like(param, dtype=dtype)
            return torch.empty(shape, dtype=dtype)
        return None  # a model or optimizer not asked for: not read (values are whole in ringtrain.pt)

    tree, kinds, meta = sharded.load(path, target_for)
    tree = {k: v for k, v in tree.items() if k in targets or kinds.get(k) == "value"}
    for name, module in targets.items():
        if not isinstance(module, nn.Module) or name not in tree:
            continue
        missing = sorted(k for k in local[name] if k not in tree[name])
        if missing or unexpected.get(name):
            raise RingtrainError(
                f"the checkpoint {path!r} does not fit {type(module).__name__}: missing keys: "
                f"{', '.join(missing[:8]) or 'none'}; unexpected keys: {', '.join(unexpected.get(name, [])[:8]) or 'none'}",
                "load it into the same model architecture it was saved from (same constructor arguments).")
    return tree, meta
