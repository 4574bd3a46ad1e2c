"""The user's model and optimizer state, whatever the layout: whole, replicated, or sharded.

A strategy hands out its *local* state: the tensors this rank holds, under the unsplit model's
names — plain tensors for one process, DDP and Horovod (every rank the same), ``DTensor``
shards under FSDP (torch's own sharded state dict), one stage's tensors under a pipeline.
From that, two forms of a checkpoint:

* **full** — plain tensors on the CPU, gathered on rank 0 (``gather_full``), with the optimizer
  numbered as ``optimizer.state_dict()`` of the same optimizer built on the unsplit model
  (``optimizer_by_index``): what ``torch.save`` files and plain PyTorch use;
* **named** — the optimizer keyed by parameter name (``named_optimizer``), which is what a
  sharded checkpoint stores (names survive any change of world size or strategy).

Loading goes the other way: a full tensor is cut to the shard this rank holds
(``shard_like``), a named optimizer state is renumbered for the optimizer at hand.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from ..errors import RingtrainError
from .model import load_model_state, strip_wrapper_prefixes


def is_sharded(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def global_shape(value: torch.Tensor) -> tuple[int, ...]:
    """The shape of the whole tensor (a DTensor's ``shape`` is already the global one)."""
    return tuple(value.shape)


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """The whole tensor (an all-gather over the shard's mesh for a DTensor: every rank of it must call)."""
    return value.full_tensor() if is_sharded(value) else value


def shard_like(full: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``full`` laid out as ``target`` is: this rank's shard of it for a DTensor, else itself (on target's device).

    Every rank already holds ``full`` (a file read on each), so the shard is cut locally, with no
    communication (``distribute_tensor(..., src_data_rank=None)``).
    """
    if tuple(full.shape) != global_shape(target):
        raise RingtrainError(
            f"a checkpoint tensor of shape {tuple(full.shape)} cannot go into one of shape {global_shape(target)}",
            "load it into the same model architecture (same constructor arguments) it was saved from.",
        )
    if is_sharded(target):
        from torch.distributed.tensor import distribute_tensor

        local = full.to(device=target.to_local().device, dtype=target.dtype)
        return distribute_tensor(local, target.device_mesh, target.placements, src_data_rank=None)
    return full.to(device=target.device, dtype=target.dtype) if torch.is_floating_point(target) else full.to(target.device)


def gather_full(tree: Any, keep: bool) -> Any:
    """``tree`` with every tensor made whole and moved to the CPU, where ``keep`` (rank 0); None elsewhere.

    Collective for sharded tensors: every rank walks the same tree in the same order, one tensor
    at a time, so at most one whole tensor is in memory beyond the shards.
    """
    if isinstance(tree, torch.Tensor):
        whole = full_tensor(tree).detach()
        return whole.cpu() if keep else None
    if isinstance(tree, Mapping):
        out = {k: gather_full(v, keep) for k, v in tree.items()}
        if not keep:
            return None
        try:  # keep the mapping's type and attributes (a state dict's _metadata)
            made = type(tree)(out)
            if hasattr(tree, "_metadata"):
                made._metadata = tree._metadata  # type: ignore[attr-defined]
            return made
        except Exception:
            return out
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        out_list = [gather_full(v, keep) for v in tree]
        return type(tree)(out_list) if keep else None
    return tree if keep else None


# --- optimizers: numbered (torch's format) <-> named (by parameter) -----------------------------

def parameter_names(module_params: Mapping[str, nn.Parameter]) -> dict[int, str]:
    """id(parameter) -> its name, for ``optimizer``'s parameters that belong to the module."""
    return {id(p): name for name, p in module_params.items()}


def named_optimizer(optimizer: torch.optim.Optimizer, names: Mapping[int, str]) -> dict[str, Any]:
    """``optimizer.state_dict()`` keyed by parameter name: ``{"state": {name: {...}}, "param_groups":
    [{..., "params": [name, ...]}]}`` (torch.distributed.checkpoint.state_dict's shape). Tensors stay as
    they are (shards stay shards). A parameter the module does not name is refused."""
    flat = [p for group in optimizer.param_groups for p in group["params"]]
    unnamed = [i for i, p in enumerate(flat) if id(p) not in names]
    if unnamed:
        raise RingtrainError(
            f"the optimizer holds {len(unnamed)} parameter(s) that are not the model's it is saved with",
            "save each optimizer beside the model it was set up with (ring.setup(model, optimizer)); an optimizer "
            "over several models needs them as one nn.Module (e.g. nn.ModuleDict).",
        )
    sd = optimizer.state_dict()
    order = [names[id(p)] for p in flat]
    state = {order[i]: dict(s) for i, s in sd["state"].items()}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [order[i] for i in g["params"]]}
              for g in sd["param_groups"]]
    return {"state": state, "param_groups": groups}


def optimizer_by_index(named: Mapping[str, Any]) -> dict[str, Any]:
    """A named optimizer state numbered the way ``optimizer.state_dict()`` numbers it: parameters in
    the order the groups list them (the unsplit optimizer's own order)."""
    order = [name for group in named["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(order)}
    return {
        "state": {index[name]: s for name, s in named["state"].items() if name in index},
        "param_groups": [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[n] for n in g["params"]]}
                         for g in named["param_groups"]],
    }


def named_from_index(sd: Mapping[str, Any], optimizer: torch.optim.Optimizer, names: Mapping[int, str]) -> dict[str, Any]:
    """A numbered optimizer state (a plain ``optimizer.state_dict()`` of the unsplit model) named by the
    parameters of ``optimizer``, which was built with the same groups in the same order."""
    ours = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
    theirs = sd.get("param_groups", [])
    if [len(g) for g in ours] != [len(g["params"]) for g in theirs]:
        raise RingtrainError(
            "the optimizer checkpoint's parameter groups do not match this optimizer's "
            f"({[len(g['params']) for g in theirs]} vs {[len(g) for g in ours]} parameters per group)",
            "build the optimizer the same way (same parameter groups, same order) as when the checkpoint was saved.",
        )
    by_index = {}
    for group_names, group in zip(ours, theirs):
        for name, i in zip(group_names, group["params"]):
            by_index[i] = name
    return {
        "state": {by_index[i]: s for i, s in sd.get("state", {}).items() if i in by_index},
        "param_groups": [{**{k: v for k, v in g.items() if k != "params"}, "params": names_}
                         for g, names_ in zip(theirs, ours)],
    }


def load_named_optimizer(optimizer: torch.optim.Optimizer, named: Mapping[str, Any], names: Mapping[int, str],
                         params: Mapping[str, torch.Tensor]) -> None:
    """Load a named state into ``optimizer``: whole tensors are cut to this rank's shards, state for
    parameters this rank does not hold (another pipeline stage's) is left out, and the hyperparameters
    come from the checkpoint group by group."""
    ours = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
    saved_groups = named["param_groups"]
    if len(saved_groups) != len(ours):
        raise RingtrainError(
            f"the optimizer checkpoint has {len(saved_groups)} parameter group(s), this optimizer {len(ours)}",
            "build the optimizer the same way (same parameter groups) as when the checkpoint was saved.",
        )
    state, groups, i = {}, [], 0
    for group_names, saved in zip(ours, saved_groups):
        ids = []
        for name in group_names:
            saved_state = named["state"].get(name)
            if saved_state is not None:
                state[i] = {k: _as_param_state(k, v, params[name]) for k, v in saved_state.items()}
            ids.append(i)
            i += 1
        groups.append({**{k: v for k, v in saved.items() if k != "params"}, "params": ids})
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def _as_param_state(key: str, value: Any, param: torch.Tensor) -> Any:
    """A per-parameter state tensor shaped like its parameter goes where the parameter is (its shard)."""
    if not isinstance(value, torch.Tensor) or key == "step":
        return value
    if is_sharded(value) or global_shape(value) != global_shape(param):
        return value
    return shard_like(value, param) if is_sharded(param) else value


def load_module_state(module: nn.Module, state_dict: Mapping[str, Any], path: str) -> None:
    """Load a whole state dict into a module whose tensors may be shards; a readable error on mismatch."""
    own = module.state_dict()
    if not any(is_sharded(v) for v in own.values()):
        load_model_state(module, state_dict, path)
        return
    state_dict = strip_wrapper_prefixes(state_dict)
    problem = _mismatch(own, state_dict)
    if problem:
        raise RingtrainError(f"the checkpoint {path!r} does not fit {type(module).__name__}: {problem}",
                             "load it into the same model architecture it was saved from (same constructor arguments).")
    module.load_state_dict({k: shard_like(state_dict[k], v) if isinstance(v, torch.Tensor) else state_dict[k]
                            for k, v in own.items()})


def _mismatch(own: Mapping[str, Any], saved: Mapping[str, Any]) -> str | None:
    missing = [k for k in own if k not in saved]
    unexpected = [k for k in saved if k not in own]
    shapes = [f"{k}: checkpoint {tuple(saved[k].shape)} vs model {global_shape(own[k])}" for k in own
              if k in saved and isinstance(saved[k], torch.Tensor) and tuple(saved[k].shape) != global_shape(own[k])]
    if not (missing or unexpected or shapes):
        return None

    def show(items: list[str]) -> str:
        return ", ".join(items[:8]) + (f" (+{len(items) - 8} more)" if len(items) > 8 else "") or "none"

    return f"missing keys: {show(missing)}; unexpected keys: {show(unexpected)}; shape mismatches: {show(shapes)}"
