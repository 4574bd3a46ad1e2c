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
from ..parallel.mesh import DP_REPLICATE, TP, Layout, data_layout, data_ranks, with_tp
from ..parallel.stages import spans_devices
from ..tracking import timeline
from . import _units, tp as tensor_parallel
from .base import BackwardSyncControl, Distributed, StageData
from .fsdp import no_gradient_sync, view_warning_once


class DDP(Distributed, BackwardSyncControl, StageData):
    """``rt.strategies.DDP(...)``: torch's DistributedDataParallel, one process per device.

    The keyword options are DistributedDataParallel's own (``find_unused_parameters``,
    ``gradient_as_bucket_view``, ``static_graph``, ``bucket_cap_mb``, ``broadcast_buffers``),
    plus ``compression``: what the gradients travel as (comm/ddp_hooks.py) — ``"none"``,
    ``"fp16"``, ``"bf16"`` (half the bytes), ``"powersgd"`` or ``PowerSGD(rank=..., start_step=...)``
    (low-rank with error feedback, ~100x fewer bytes), ``"auto"`` (measure the link at start-up
    and pick; the choice is printed). ``ring.setup(model, optimizer, find_unused_parameters=True)``
    still works and wins.

    ``tp=N`` (or ``tp=rt.strategies.TP(N, ...)``): W/N replicas of a tensor-parallel group of N ranks (tp.py). Its
    parameters are DTensors, which DistributedDataParallel cannot hold (torch's own DDP + TP path swaps them for new
    local tensors every forward); the replicas are then kept in step by FSDP2's ``replicate`` on the
    ``dp_replicate`` sub-mesh (torchtitan's DDP x TP), so ``compression=`` and DistributedDataParallel's options
    do not apply.
    """

    name = "ddp"
    MODULE_OPTIONS = frozenset(
        {"find_unused_parameters", "gradient_as_bucket_view", "static_graph", "bucket_cap_mb", "broadcast_buffers"}
    )
    backward_syncs = True

    def __init__(self, *, compression: str = "none", tp: Any = None, **ddp_options: Any):
        super().__init__()
        compression = ddp_hooks.check(compression)
        unknown = set(ddp_options) - self.MODULE_OPTIONS
        if unknown:
            raise RingtrainError(f"DDP got unknown option(s) {sorted(unknown)}",
                                 f"DistributedDataParallel's options are {sorted(self.MODULE_OPTIONS)}.")
        self.tp = tensor_parallel.of(tp, "DDP")
        if self.tp is not None and (compression != "none" or ddp_options):
            raise RingtrainError(f"DDP(tp={self.tp.size}) got {'compression=' if compression != 'none' else ''}"
                                 f"{' '.join(sorted(ddp_options))}",
                                 "under tensor parallelism the replicas are kept in step by FSDP2's replicate, not "
                                 "DistributedDataParallel: drop those options.")
        self.shards_state = self.tp is not None  # cut parameters: sharded folders by default
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
        if self.tp is not None:
            return self._replicas_of_tp(module, options)
        return self.apply(self.blocks.apply(module), None, self.device, **options)

    # --- DDP(tp=N): a TP group per replica, the replicas kept in step on dp_replicate ------------
    def check_job(self) -> None:
        if self.tp is not None:
            data_ranks(self.env.world_size, self.tp.size, f"DDP(tp={self.tp.size})")
        super().check_job()

    def layout(self) -> Layout:
        tp = self.tp.size if self.tp is not None else 1
        return Layout(with_tp(data_layout(self.world_size // tp), tp))

    def configure(self, *, accumulate: int = 1, nonfinite: str = "raise", sync_batchnorm: bool = False) -> None:
        if self.tp is not None:
            tensor_parallel.refuse_sync_batchnorm(sync_batchnorm, repr(self))

    def setup_module(self, module: nn.Module, precision: Any, **options: Any) -> nn.Module:
        if self.tp is not None:
            tensor_parallel.refuse_precision(precision, repr(self))
        return super().setup_module(module, precision, **options)

    def _replicas_of_tp(self, module: nn.Module, options: dict[str, Any]) -> nn.Module:
        from torch.distributed._composable.replicate_with_fsdp import replicate

        if options:
            raise RingtrainError(f"ring.setup got {sorted(options)} with DDP(tp={self.tp.size})",
                                 "DistributedDataParallel's options do not apply under tensor parallelism: drop them.")
        self.tp.cut(module, self.mesh[TP], self.device)
        self.blocks.apply(module)  # after the cut, before the replicas (compiling.py)
        # torchtitan's apply_replicate: the repeated blocks as units of their own (their all-reduce overlaps the
        # rest of the backward), then the model; gradients are averaged over the replicas, as DDP's are.
        for name in _units.choose(module, "auto"):
            replicate(module.get_submodule(name), mesh=self.mesh[DP_REPLICATE])
        replicate(module, mesh=self.mesh[DP_REPLICATE])
        view_warning_once()
        self.tp.watch(module, self.mesh[TP], lambda: self.named_parameters(module))
        tensor_parallel.together(self, module)
        return module

    def step_context(self, optimizer: torch.optim.Optimizer) -> ContextManager:
        return self.tp.guards.after_step(optimizer) if self.tp is not None else contextlib.nullcontext()

    def clip_grad_norm_(self, module: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        if self.tp is not None:
            return tensor_parallel.clip_grad_norm_(module, max_norm, norm_type)
        return super().clip_grad_norm_(module, max_norm, norm_type)

    # --- in a pipeline (StageData): each stage replicated over its sub-mesh of D ranks ------------
    def dims_over(self, replicas: int) -> tuple[tuple[str, int], ...]:
        """Over the ``replicas`` ranks of each stage: ``("dp_replicate", D)``, then ``("tp", N)`` under tp=N."""
        if self.tp is None:
            return data_layout(replicas)
        if self.tp.sequence_parallel:
            raise RingtrainError(f"Pipeline(data={self!r}): sequence parallelism inside a pipeline stage is not "
                                 "supported yet (a stage would send its sequence shard to the next)",
                                 "drop sequence_parallel=True under a pipeline (tp=N alone works).")
        data = data_ranks(replicas, self.tp.size, f"Pipeline(data={self!r}) on the {replicas} ranks of each stage")
        return with_tp(data_layout(data), self.tp.size)

    def place_stage(self, stage: nn.Module, *, mesh: Any, device: Any, precision: Any, meta: bool,
                    broadcast: Any) -> None:
        if self.tp is not None:  # TP on the stage's tp sub-mesh, then FSDP2's replicate on dp_replicate
            from torch.distributed._composable.replicate_with_fsdp import replicate

            tensor_parallel.refuse_precision(precision, f"Pipeline(data={self!r})")
            self.tp.cut(stage, mesh[TP], device, broadcast=broadcast)
            replicate(stage, mesh=mesh[DP_REPLICATE])
            self.tp.watch(stage, mesh[TP])
            return
        stage.to_empty(device=device) if meta else stage.to(device)
        if precision is not None:
            precision.wrap_forward(stage)  # autocast around each stage forward, float32 out

    def run_stage(self, stage: nn.Module, *, mesh: Any, device: Any) -> nn.Module:
        if self.tp is not None:
            return stage  # replicated in place_stage
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
        return no_gradient_sync(module)  # DDP(tp=N): FSDP2's replicate (none without it)

    def __repr__(self) -> str:
        options = {**self.ddp_options, **({"compression": self.compression} if self.compression != "none" else {}),
                   **({"tp": tensor_parallel.shown(self.tp)} if self.tp is not None else {})}
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
