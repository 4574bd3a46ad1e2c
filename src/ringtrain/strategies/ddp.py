"""DistributedDataParallel: one process per device, on one node or many.

The gradient all-reduce is torch's own (``DistributedDataParallel`` and its comm
hooks); the process group is the service in parallel/group.py. This file holds DDP's options
and wraps the module.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..comm import ddp_hooks
from ..errors import RingtrainError
from ..parallel.mesh import data_layout
from ..parallel.stages import spans_devices
from ..tracking import timeline
from .base import BackwardSyncControl, Distributed, StageData


class DDP(Distributed, BackwardSyncControl, StageData):
    """``rt.strategies.DDP(...)``: torch's DistributedDataParallel, one process per device.

    The keyword options are DistributedDataParallel's own (``find_unused_parameters``,
    ``gradient_as_bucket_view``, ``static_graph``, ``bucket_cap_mb``, ``broadcast_buffers``),
    plus ``compression``: what the gradients travel as (comm/ddp_hooks.py) — ``"none"``,
    ``"fp16"``, ``"bf16"`` (half the bytes), ``"powersgd"`` or ``PowerSGD(rank=..., start_step=...)``
    (low-rank with error feedback, ~100x fewer bytes), ``"auto"`` (measure the link at start-up
    and pick; the choice is printed). ``ring.setup(model, optimizer, find_unused_parameters=True)``
    still works and wins.
    """

    name = "ddp"
    MODULE_OPTIONS = frozenset(
        {"find_unused_parameters", "gradient_as_bucket_view", "static_graph", "bucket_cap_mb", "broadcast_buffers"}
    )
    backward_syncs = True

    def __init__(self, *, compression: str = "none", **ddp_options: Any):
        super().__init__()
        compression = ddp_hooks.check(compression)
        unknown = set(ddp_options) - self.MODULE_OPTIONS
        if unknown:
            raise RingtrainError(f"DDP got unknown option(s) {sorted(unknown)}",
                                 f"DistributedDataParallel's options are {sorted(self.MODULE_OPTIONS)}.")
        self.compression = compression
        self.ddp_options = ddp_options
        self.hooks: list[Any] = []  # each replica's comm-hook state (its bytes, PowerSGD's matrices)
        self.chosen: ddp_hooks.LinkChoice | None = None  # compression="auto"'s measurement and choice
        self._saved_comm: dict[str, Any] | None = None  # loaded before ring.setup: applied at replicate

    def wrap_module(self, module: nn.Module, **options: Any) -> nn.Module:
        if not any(p.requires_grad for p in module.parameters()):
            raise RingtrainError(
                f"{type(module).__name__} has no trainable parameters, so DDP has nothing to synchronise",
                "pass the model you train to ring.setup, or use ring.setup only for trainable models.",
            )
        return self.apply(module, None, self.device, **options)

    # --- in a pipeline (StageData): each stage replicated over its sub-mesh of D ranks ------------
    def dims_over(self, replicas: int) -> tuple[tuple[str, int], ...]:
        return data_layout(replicas)

    def place_stage(self, stage: nn.Module, *, mesh: Any, device: Any, precision: Any, meta: bool,
                    broadcast: Any) -> None:
        stage.to_empty(device=device) if meta else stage.to(device)
        if precision is not None:
            precision.wrap_forward(stage)  # autocast around each stage forward, float32 out

    def run_stage(self, stage: nn.Module, *, mesh: Any, device: Any) -> nn.Module:
        # DDP starts the replicas from the first one's weights and averages their gradients.
        return self.apply(stage, mesh.get_group(), device) if mesh.size() > 1 else stage

    def apply(self, module: nn.Module, group: Any, device: Any, **options: Any) -> DistributedDataParallel:
        """``module`` (on ``device``) as torch's DistributedDataParallel over ``group`` (None: the whole job)."""
        # A module on several devices (model parallel inside each process) must leave device_ids
        # unset (DistributedDataParallel's documented rule for multi-device modules).
        device_ids = [device.index] if device.type == "cuda" and not spans_devices(module) else None
        # DDP broadcasts the group's first rank's parameters and buffers on construction, so every
        # rank starts from the same weights whatever its own initialisation did.
        wrapped = DistributedDataParallel(module, device_ids=device_ids, process_group=group,
                                          **{**self.ddp_options, **options})
        made = ddp_hooks.make_hook(self.resolved(module, group), module, group)
        state, hook = made if made is not None else (group, None)
        # A timeline records each bucket's all-reduce (None: DDP's built-in).
        hook = timeline.comm_hook(hook, self.activity.recorder)
        if hook is not None:
            wrapped.register_comm_hook(state, hook)
        if made is not None:
            self.hooks.append(state)
            if self._saved_comm is not None:
                self._load_hook_state(state, self._saved_comm)
        wrapped.register_forward_pre_hook(_evaluation_starts)
        wrapped.register_forward_hook(_evaluation_ends)
        return wrapped

    def resolved(self, module: nn.Module, group: Any) -> Any:
        """The compression in force: ``"auto"`` measures the link once (collective) and picks by
        ddp_hooks.rule, printed on the main process."""
        if self.compression != "auto":
            return self.compression
        if self.chosen is None:
            bus = ddp_hooks.measure_bus_bandwidth(group, self.device)
            grad_bytes = ddp_hooks.gradient_bytes(module)
            self.chosen = ddp_hooks.rule(bus, grad_bytes, self.world_size)
            if self.rank == 0:
                print(f"ringtrain: {self.chosen.describe(grad_bytes / 1e6)}", flush=True)
        return self.chosen.compression

    def bytes_per_step(self, module: nn.Module) -> int:
        """Bytes this rank all-reduced for its gradients in the last complete step (per replica, summed)."""
        if self.hooks:
            return sum(h.sent_last_step for h in self.hooks)
        return ddp_hooks.gradient_bytes(self.unwrap(module))

    # --- compression state in checkpoints: Q matrices, every rank's error feedback, the step count --
    def comm_state(self) -> dict[str, Any] | None:
        """Collective: every rank's hook state, gathered (on every rank)."""
        if not any(isinstance(h, ddp_hooks.PowerSGDHook) for h in self.hooks):
            return None
        return {"world_size": self.world_size,
                "ranks": self.gather_object([h.state_dict() for h in self.hooks])}

    def load_comm_state(self, saved: dict[str, Any] | None) -> None:
        if not saved:
            return
        self._saved_comm = saved
        for state in self.hooks:
            self._load_hook_state(state, saved)

    def _load_hook_state(self, state: Any, saved: dict[str, Any]) -> None:
        same_world = saved.get("world_size") == self.world_size
        mine = saved["ranks"][self.rank if same_world else 0]
        index = self.hooks.index(state) if state in self.hooks else len(self.hooks) - 1
        if index < len(mine):
            state.load_state_dict(mine[index], error=same_world)

    def unwrap(self, module: nn.Module) -> nn.Module:
        return module.module if isinstance(module, DistributedDataParallel) else module

    def no_sync(self, module: nn.Module) -> ContextManager:
        if isinstance(module, DistributedDataParallel):
            return module.no_sync()
        return contextlib.nullcontext()

    def __repr__(self) -> str:
        options = {**self.ddp_options, **({"compression": self.compression} if self.compression != "none" else {})}
        return f"DDP({', '.join(f'{k}={v!r}' for k, v in options.items())})"


# A forward under torch.no_grad (evaluation) runs no collective: DDP's own forward would broadcast the buffers
# (BatchNorm's statistics) from rank 0 first, so an evaluation on rank 0 alone — `if rank == 0: evaluate(model)`,
# the most common script there is — paired its broadcast with another rank's next training forward and the ranks
# fell out of step (Gloo: "Received data size doesn't match expected size", then SIGABRT). Skipped here, and the
# flag DDP keeps for the next forward is put back as it was: training forwards broadcast exactly as before. An
# evaluation then uses this rank's own buffers (rank 0's: the ones training broadcasts).
def _evaluation_starts(module: DistributedDataParallel, args: Any) -> None:
    if not torch.is_grad_enabled():
        module._ringtrain_sync_after = module.require_forward_param_sync
        module.require_forward_param_sync = False


def _evaluation_ends(module: DistributedDataParallel, args: Any, output: Any) -> None:
    if not torch.is_grad_enabled() and hasattr(module, "_ringtrain_sync_after"):
        module.require_forward_param_sync = module._ringtrain_sync_after
