"""A pipeline's checkpoints: one unsplit state, whatever the number of stages (``StageCheckpoints``).

Each rank holds its stage(s) under the unsplit model's names (stages.py keeps them). A full
checkpoint gathers replica 0's stages on rank 0 — FSDP stages first made whole over their
replicas — into the state dict and ``optimizer.state_dict()`` the unsplit model and its optimizer
would have (parameters numbered in model order within each group); loading cuts it back into any
number of stages. Sharded checkpoints (sharded.py) read and write each rank's stage(s) through
the Strategy contract's ``local_state`` / ``named_parameters`` / ``load_local_state``.

A mixin of ``Pipeline`` (pipeline.py): it reads the pipeline's ``_local`` stages, ``_root_keys``,
``_param_order`` and ``pp_group``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..checkpoint import state
from ..checkpoint.model import strip_wrapper_prefixes
from ..errors import RingtrainError


class StageCheckpoints:
    """The checkpoint hooks of the Strategy contract for a model cut into stages."""

    _local: list[nn.Module]
    _root_keys: list[str]
    _param_order: list[str]

    def _gather_to_main(self, part: Any) -> list[Any] | None:
        """``part`` from replica 0's ranks (one per stage), on rank 0; None elsewhere."""
        mine = part if self.data_parallel_rank == 0 else None
        out: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(mine, out, dst=0)
        return [p for p in out if p is not None] if out is not None else None

    def full_state_dict(self) -> OrderedDict[str, torch.Tensor] | None:
        """The unsplit model's state dict (CPU tensors) on rank 0, None on other ranks. Collective."""
        mine = state.gather_full(self.local_state(None), keep=True)  # FSDP stages: whole over their replicas
        parts = self._gather_to_main(mine)
        if parts is None:
            return None
        merged = {k: v for part in parts for k, v in part.items()}
        return OrderedDict((k, merged[k]) for k in self._root_keys)

    def load_full_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load an unsplit state dict (saved with any number of stages, or by one process) into the local stage(s)."""
        state_dict = strip_wrapper_prefixes(state_dict)
        unexpected = [k for k in state_dict if k not in set(self._root_keys)]
        for stage in self._local:
            own = stage.state_dict()
            missing = [k for k in own if k not in state_dict]
            if missing or unexpected:
                raise RingtrainError(
                    f"the checkpoint does not fit the model: missing keys {missing[:8]}, unexpected keys {unexpected[:8]}",
                    "load a checkpoint of the same architecture (the unsplit model's state dict).",
                )
            state.load_module_state(stage, {k: state_dict[k] for k in own}, "the checkpoint")

    # The Strategy contract's checkpoint hooks: one unsplit state dict, whatever S was; sharded
    # checkpoints read and write each rank's stage(s) under the unsplit model's names.
    def named_parameters(self, module: nn.Module | None) -> dict[str, nn.Parameter]:
        return {n: p for stage in self._local for n, p in stage.named_parameters()}

    def local_state(self, module: nn.Module | None) -> dict[str, Any]:
        return {k: v for stage in self._local for k, v in stage.state_dict().items()}

    def state_keys(self, module: nn.Module | None) -> set[str]:
        return set(self._root_keys)

    def load_local_state(self, module: nn.Module | None, state_dict: dict[str, Any]) -> None:
        for stage in self._local:
            stage.load_state_dict({k: state_dict[k] for k in stage.state_dict()})

    def module_state(self, module: nn.Module) -> Any:
        return self.full_state_dict()

    def load_module_state(self, module: nn.Module, state_dict: Any, path: str) -> None:
        self.load_full_state_dict(state_dict)

    def optimizer_state(self, optimizer: torch.optim.Optimizer, module: nn.Module | None = None) -> Any:
        return self.full_optimizer_state_dict(optimizer)

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state_dict: Any,
                             module: nn.Module | None = None) -> None:
        self.load_full_optimizer_state_dict(optimizer, state_dict)

    def _group_layout(self, optimizer: torch.optim.Optimizer) -> tuple[list[list[str]], dict[int, str]]:
        """The unsplit optimizer's groups as parameter names (in model order), and local param id -> name."""
        names = {id(p): n for stage in self._local for n, p in stage.named_parameters()}
        local = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
        everyone: list[Any] = [None] * self.num_stages
        dist.all_gather_object(everyone, local, group=self.pp_group)
        order = {n: i for i, n in enumerate(self._param_order)}
        groups = [sorted({n for part in everyone for n in part[j]}, key=order.__getitem__) for j in range(len(local))]
        return groups, names

    def full_optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """The optimizer state as ``optimizer.state_dict()`` of the same optimizer built on the unsplit
        model would be (parameters numbered in model order within each group), on rank 0. Collective."""
        groups, names = self._group_layout(optimizer)
        local_sd = optimizer.state_dict()
        flat = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
        # FSDP stages: each state tensor made whole over the stage's replicas (collective, same order on all)
        mine = {flat[i]: state.gather_full(dict(st), keep=True) for i, st in local_sd["state"].items()}
        parts = self._gather_to_main(mine)
        if parts is None:
            return None
        index = {n: i for i, n in enumerate(n for g in groups for n in g)}
        merged = {index[n]: st for part in parts for n, st in part.items()}
        param_groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[n] for n in names_]}
                        for g, names_ in zip(local_sd["param_groups"], groups)]
        return {"state": dict(sorted(merged.items())), "param_groups": param_groups}

    def load_full_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state_dict: Mapping[str, Any]) -> None:
        """Load an unsplit optimizer state dict (from ``full_optimizer_state_dict`` or one process) into the local optimizer."""
        groups, names = self._group_layout(optimizer)
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(groups) or [len(g["params"]) for g in saved_groups] != [len(g) for g in groups]:
            raise RingtrainError(
                "the optimizer checkpoint's parameter groups do not match this optimizer's",
                "build the optimizer the same way (same parameter groups) as when the checkpoint was saved.",
            )
        index = {n: i for i, n in enumerate(n for g in groups for n in g)}
        named = {
            "state": {n: state_dict["state"][index[n]] for n in names.values() if index[n] in state_dict["state"]},
            "param_groups": [{**{k: v for k, v in saved.items() if k != "params"}, "params": g}
                             for saved, g in zip(saved_groups, groups)],
        }
        state.load_named_optimizer(optimizer, named, names, self.named_parameters(None))
