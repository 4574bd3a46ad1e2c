"""Fully sharded data parallel: each rank holds 1/W of the parameters, gradients and optimizer state.

The engine is torch's FSDP2 (``torch.distributed.fsdp.fully_shard``: per-parameter DTensor
shards on a device mesh), never the legacy ``FullyShardedDataParallel``. Before a unit's
forward its parameters are all-gathered, after its backward its gradients are
reduce-scattered (averaged), and the optimizer steps only the shards: ZeRO-3 (Rajbhandari et
al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"). Which
submodules are units is ``wrap=`` (_units.py). This file maps the Ring's options onto it:

* ``Ring(accumulate=k)`` -> ``set_requires_gradient_sync(False)`` inside a window: gradients
  accumulate unsharded and are reduce-scattered once, at the boundary;
* ``precision="bf16-mixed"`` -> ``MixedPrecisionPolicy``: bf16 parameters in compute, gradients
  reduced in fp32, outputs in fp32 (instead of autocast); ``"16-mixed"`` is refused (its loss
  scaler would need every rank's inf check over sharded gradients);
* ``ring.clip_grad_norm_`` -> the norm of the whole gradient, summed over the shards (DTensor);
* ``replicate=k`` -> HSDP: a 2-D mesh ``(dp_replicate=k, dp_shard=W/k)``: shard inside each group
  of W/k ranks (e.g. a node), replicate across groups (all-reduce);
* a model built on the meta device is sharded first, then only this rank's shards are allocated
  and initialised (materialize.py);
* checkpoints are sharded folders by default (sharded.py; ``ring.save(..., full=True)`` for one file);
* ``tp=N`` -> FSDP x TP: tensor parallelism over groups of N neighbouring ranks first (tp.py, on ``mesh["tp"]``),
  then ``fully_shard`` on the data dimensions' sub-mesh: each parameter a 2-D DTensor (torchtitan's order).

The optimizer the user built on the unsharded model is pointed at the shards by ``ring.setup``
(optim.replace_parameters). Without the meta device every rank starts from rank 0's weights,
as DDP's constructor does: FSDP2 itself would shard whatever each rank built.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, ContextManager

import torch
import torch.distributed as dist
from torch import nn

from ..errors import RingtrainError
from ..parallel.mesh import TP, Layout, data_layout, data_ranks, with_tp
from . import _units, materialize, tp as tensor_parallel
from ._evaluation import EvaluationTogether
from .base import BackwardSyncControl, Distributed, StageData

OFFLOADS = (None, "cpu")


class FSDP(Distributed, BackwardSyncControl, StageData):
    """``rt.strategies.FSDP(wrap="auto", reshard_after_forward=True, offload=None, replicate=1)``.

    ``wrap``: the shard units ("auto", a list of module classes, a function ``(name, module) ->
    bool``, or None); ``reshard_after_forward``: True frees a unit's gathered parameters after its
    forward and gathers them again for backward (ZeRO-3, least memory), False keeps them until
    backward (ZeRO-2-like: less communication), an int reshards to groups of that many ranks;
    ``offload="cpu"``: shards, gradients and the optimizer step live in CPU memory (torch's
    ``CPUOffloadPolicy``); ``replicate=k``: HSDP, sharded within groups of W/k ranks, replicated
    across the k groups; ``tp=N`` (or ``tp=rt.strategies.TP(N, plan=..., sequence_parallel=...)``): tensor
    parallelism inside groups of N ranks, FSDP (or HSDP) across them.
    """

    name = "fsdp"
    backward_syncs = True  # the backward's reduce-scatter waits for the other ranks
    shards_state = True

    def __init__(self, *, wrap: Any = "auto", reshard_after_forward: bool | int = True, offload: str | None = None,
                 replicate: int = 1, tp: Any = None):
        super().__init__()
        if not isinstance(reshard_after_forward, (bool, int)) or (
                not isinstance(reshard_after_forward, bool) and reshard_after_forward < 2):
            raise RingtrainError(f"FSDP got reshard_after_forward={reshard_after_forward!r}",
                                 "use True (ZeRO-3), False (keep gathered until backward) or a group size >= 2.")
        if offload not in OFFLOADS:
            raise RingtrainError(f"FSDP got offload={offload!r}", "use offload=None or offload='cpu'.")
        if isinstance(replicate, bool) or not isinstance(replicate, int) or replicate < 1:
            raise RingtrainError(f"FSDP got replicate={replicate!r}",
                                 "replicate is the number of replica groups (1: plain FSDP; e.g. the number of nodes).")
        if wrap != "auto" and wrap is not None and not callable(wrap) and not isinstance(wrap, (list, tuple, set)):
            _units.choose(nn.Module(), wrap)  # raises the wrap= error
        self.tp = tensor_parallel.of(tp, "FSDP")
        if self.tp is not None and offload is not None:
            raise RingtrainError(f"FSDP(tp={self.tp.size}, offload={offload!r}) is not supported yet",
                                 "drop offload= with tensor parallelism (or tp= with offload).")
        self.wrap = wrap
        self.reshard_after_forward = reshard_after_forward
        self.offload = offload
        self.replicate = replicate
        self.units: list[str] = []  # the submodules sharded as units of their own, for messages and tests

    def __repr__(self) -> str:
        options = {"wrap": self.wrap if self.wrap in ("auto", None) else "custom",
                   "reshard_after_forward": self.reshard_after_forward, "offload": self.offload,
                   "replicate": self.replicate,
                   "tp": tensor_parallel.shown(self.tp)}
        defaults = {"wrap": "auto", "reshard_after_forward": True, "offload": None, "replicate": 1, "tp": None}
        return f"FSDP({', '.join(f'{k}={v!r}' for k, v in options.items() if v != defaults[k])})"

    def check_job(self) -> None:
        tp = self.tp.size if self.tp is not None else 1
        data = data_ranks(self.env.world_size, tp, repr(self)) if tp > 1 else self.env.world_size
        if data % self.replicate:
            among = f"the {data} data-parallel ranks (the {self.env.world_size} processes in groups of tp={tp})" \
                if tp > 1 else f"the {data} processes started"
            raise RingtrainError(
                f"FSDP(replicate={self.replicate}) does not divide {among}",
                f"start a multiple of {self.replicate * tp} processes, or choose replicate among the divisors of "
                f"{data} (e.g. the number of nodes).",
            )
        super().check_job()

    def layout(self) -> Layout:
        tp = self.tp.size if self.tp is not None else 1
        return Layout(with_tp(data_layout(self.world_size // tp, self.replicate, shard=True), tp))

    def configure(self, *, accumulate: int = 1, nonfinite: str = "raise", sync_batchnorm: bool = False) -> None:
        if self.tp is not None:
            tensor_parallel.refuse_sync_batchnorm(sync_batchnorm, repr(self))

    # --- in a pipeline (StageData): each stage sharded over its sub-mesh of D ranks ---------------
    def dims_over(self, replicas: int) -> tuple[tuple[str, int], ...]:
        """Over the ``replicas`` ranks of each stage: the data dimensions, then ``("tp", N)`` innermost under tp=N
        (torchtitan's pp x dp x tp mesh: a stage's TP group is neighbouring ranks)."""
        tp = self.tp.size if self.tp is not None else 1
        if tp > 1 and self.tp.sequence_parallel:
            raise RingtrainError(f"Pipeline(data={self!r}): sequence parallelism inside a pipeline stage is not "
                                 "supported yet (a stage would send its sequence shard to the next)",
                                 "drop sequence_parallel=True under a pipeline (tp=N alone works).")
        data = data_ranks(replicas, tp, f"Pipeline(data={self!r}) on the {replicas} ranks of each stage") \
            if tp > 1 else replicas
        if data % self.replicate:
            raise RingtrainError(f"Pipeline(data=FSDP(replicate={self.replicate})) does not divide the {data} "
                                 "data-parallel replicas of each stage",
                                 f"choose replicate among the divisors of {data}.")
        return with_tp(data_layout(data, self.replicate, shard=True), tp)

    def place_stage(self, stage: nn.Module, *, mesh: Any, device: torch.device, precision: Any, meta: bool,
                    broadcast: Any) -> None:
        if self.tp is None:
            self.shard(stage, precision, mesh, device, broadcast=broadcast, init=False)
            return
        # torchtitan's order within a stage: TP on the stage's tp sub-mesh, then FSDP2 on its data sub-mesh.
        tensor_parallel.refuse_precision(precision, f"Pipeline(data={self!r})")
        self.tp.cut(stage, mesh[TP], device, broadcast=broadcast)  # the stage's first rank's weights, cut
        names = tuple(n for n in mesh.mesh_dim_names if n != TP)
        self.shard(stage, precision, mesh[names if len(names) > 1 else names[0]], device,
                   broadcast=lambda _tensor: None, init=False)
        self.tp.watch(stage, mesh[TP])  # the drift guard over the stage's TP group (the pipeline's step_context)

    def run_stage(self, stage: nn.Module, *, mesh: Any, device: torch.device) -> nn.Module:
        return stage  # the shards are the stage

    @property
    def data_mesh(self) -> Any:
        """The mesh FSDP shards over: the whole job's, or its data dimensions under tp= (a pipeline hands it a
        sub-mesh instead)."""
        if self.tp is None:
            return self.mesh
        names = tuple(n for n in self.layout().names if n != TP)
        return self.mesh[names if len(names) > 1 else names[0]]

    # --- model --------------------------------------------------------------------------------
    def setup_module(self, module: nn.Module, precision: Any, **options: Any) -> nn.Module:
        sharded = self._tensor_parallel_then_shard(module, precision)
        if self.world_size > 1 and self.group.store is not None:
            sharded.register_forward_pre_hook(EvaluationTogether(self), prepend=True)
        return sharded

    def wrap_module(self, module: nn.Module, **options: Any) -> nn.Module:
        """``module`` sharded in place with fp32 parameters (``setup_module`` passes the ring's precision)."""
        return self._tensor_parallel_then_shard(module, None)

    def _tensor_parallel_then_shard(self, module: nn.Module, precision: Any) -> nn.Module:
        if self.tp is None:
            return self.shard(self.blocks.apply(module), precision, self.data_mesh, self.device)
        tensor_parallel.refuse_precision(precision, repr(self))
        self.tp.cut(module, self.mesh[TP], self.device)  # rank 0's weights, cut: the shards come from those
        self.blocks.apply(module)  # checkpointing and compile after the cut, before the shards (compiling.py)
        sharded = self.shard(module, precision, self.data_mesh, self.device, broadcast=lambda _tensor: None)
        self.tp.watch(sharded, self.mesh[TP], lambda: self.named_parameters(sharded))
        return sharded

    def step_context(self, optimizer: torch.optim.Optimizer) -> ContextManager:
        return self.tp.guards.after_step(optimizer) if self.tp is not None else contextlib.nullcontext()

    def shard(self, module: nn.Module, precision: Any, mesh: Any, device: torch.device,
              broadcast: Any = None, init: bool = True) -> nn.Module:
        """Apply FSDP2 to ``module`` on ``mesh`` in place: its units, then itself; returns it.

        ``broadcast(tensor)``: sends rank 0's values to the ranks of ``mesh`` (the whole job's
        default group when None), so every rank shards the same weights. A module on the meta
        device gets only its shards allocated, and initialised unless ``init=False`` (a pipeline
        initialises its whole model in order itself).
        """
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            FSDPModule,
            MixedPrecisionPolicy,
            OffloadPolicy,
            fully_shard,
        )

        if isinstance(module, FSDPModule):
            raise RingtrainError("ring.setup got a model that fully_shard already sharded",
                                 "pass the plain model: the ring shards it for strategy='fsdp'.")
        dtype = getattr(precision, "dtype", None)
        if dtype is torch.float16:
            raise RingtrainError(
                "precision='16-mixed' with strategy='fsdp': fp16 loss scaling over sharded gradients is not supported",
                "use precision='bf16-mixed' (no loss scaling needed) or '32' with FSDP, or fp16 with strategy='ddp'.",
            )
        # bf16 parameters in compute and between units; fp32 gradient reduction, and fp32 out of the whole model
        # only: an inner unit that cast its output back would hand the next one's bf16 weights a float32 input,
        # which CUDA's kernels (LayerNorm: "expected scalar type Float but found BFloat16") refuse.
        inner, outer = ((MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
                         MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                              output_dtype=torch.float32))
                        if dtype is torch.bfloat16 else (MixedPrecisionPolicy(), MixedPrecisionPolicy()))
        offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if self.offload == "cpu" else OffloadPolicy()
        meta = materialize.on_meta(module)
        if meta and init:
            materialize.check(module)
            rng = materialize.rank0_rng_state(self.broadcast_object)
        elif not meta:
            # Rank 0's weights to every rank, from the device: a group the script formed with NCCL alone (the
            # tutorials' init_process_group("nccl")) has no way for CPU tensors.
            module.to(device)
            for t in (*module.parameters(), *module.buffers()):
                if broadcast is None:
                    dist.broadcast(t.data, src=0)
                else:
                    broadcast(t.data)
        self.units = _units.choose(module, self.wrap)
        full = _full_precision_norms(module, dtype)  # leaves first, before the units: fully_shard goes bottom-up
        norm = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, output_dtype=dtype)
        for name in [*full, *(u for u in self.units if u not in full)]:
            fully_shard(module.get_submodule(name), mesh=mesh, reshard_after_forward=self.reshard_after_forward,
                        mp_policy=norm if name in full else inner, offload_policy=offload)
        # The model's own unit is needed again as soon as backward starts: keep it gathered (torch's default).
        fully_shard(module, mesh=mesh, reshard_after_forward=False, mp_policy=outer, offload_policy=offload)
        view_warning_once()
        if meta:
            module.to_empty(device="cpu" if self.offload == "cpu" else device)
            if self.offload == "cpu" and device.type != "cpu":
                for sub in module.modules():
                    for name, buf in list(sub.named_buffers(recurse=False)):
                        setattr(sub, name, buf.to(device))
            if init:
                materialize.materialize(module, rng)
        return module

    def no_sync(self, module: nn.Module) -> ContextManager:
        return no_gradient_sync(module)

    def clip_grad_norm_(self, module: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip by the norm of the whole gradient (summed over every rank's shard); return that norm."""
        norm = torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm, norm_type=norm_type)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def view_warning_once() -> None:
    """torch warns in every process that a module FSDP2 wrapped (fully_shard, or replicate under DDP(tp=N)) returned
    a view (nanoGPT's logits[:, [-1], :]): the job says it once, on rank 0 (the job's rank: a pipeline's stage
    strategy is not attached to the job)."""
    if dist.is_initialized() and dist.get_rank() != 0:
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


@contextlib.contextmanager
def no_gradient_sync(module: nn.Module):
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule):
        yield
        return
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)



def _full_precision_norms(module: nn.Module, dtype: Any) -> list[str]:
    """Under bf16, BatchNorm layers compute in float32 (as FSDP1's MixedPrecision does by default): their running
    statistics are float32 buffers, and the CPU kernel refuses bf16 weights beside them ("expected scalar type
    BFloat16 but found Float"). Those with parameters become units of their own that take float32 in and give
    ``dtype`` out (their names, leaves first); those without get the same casts from hooks here."""
    if dtype is not torch.bfloat16:
        return []
    names = []
    for name, sub in module.named_modules():
        if not name or not isinstance(sub, nn.modules.batchnorm._BatchNorm):
            continue
        if any(True for _ in sub.parameters(recurse=False)):
            names.append(name)
        else:
            sub.register_forward_pre_hook(lambda _m, args: tuple(
                a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args))
            sub.register_forward_hook(lambda _m, _args, out: out.to(dtype))
    return sorted(names, key=lambda n: -n.count("."))
