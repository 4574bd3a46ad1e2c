"""Pipeline parallelism across processes, with data parallelism across pipeline replicas.

The schedule is torch's own (``torch.distributed.pipelining``: ``PipelineStage``
with ``ScheduleGPipe``, ``Schedule1F1B`` or ``ScheduleInterleaved1F1B``); the
process group is the service every distributed strategy uses (_group.py). This file adds what a training loop needs
around them: cutting the model by module name (stages.py), keeping only this
rank's stage in memory, a step that returns the loss on every rank, data
parallelism over replicas, global-norm clipping, and full (unsplit) checkpoints.

Layout (W = S x D ranks): rank = stage * D + replica — the pipeline dimension
outermost, as torchtitan's ``["pp", "dp"]`` mesh and Megatron-LM's rank order
put it, so a stage's data-parallel peers are neighbouring ranks (same node
when a node holds D or more). Ranks of one replica form a pipeline group (the
schedule's point-to-point traffic); ranks of one stage form a data-parallel
group (a gradient all-reduce after the schedule). The loader must shard by
``data_parallel_rank`` / ``data_parallel_size``: every stage of a replica sees
the same batches (stage 0 uses x, the last stage y).

Numerics: the schedule runs with ``scale_grads=False`` and the loss of each
micro-batch divided by M (and by the accumulation window), so a step's
gradient is that of the mean loss over the whole batch — exactly as the unsplit
model computes it — and gradients of several steps add up correctly
(torch's ``scale_grads=True`` would divide already-accumulated gradients again).
Gradient accumulation = several ``pipeline_step`` calls before ``optimizer.step``
(the data-parallel all-reduce runs only on the last, ``sync=True``); raising M
is the cheaper way to a larger batch, since it also shrinks the bubble.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from ..checkpoint import strip_wrapper_prefixes
from ..errors import RingtrainError
from ..stages import Stage, cut, dynamic_mode_problem, meta_shapes, release
from .base import Distributed, PipelineSchedule

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RingtrainError(f"pipeline got {name}={value!r}", f"{name} is a positive integer.")
    return value


class Pipeline(Distributed, PipelineSchedule):
    """``rt.strategies.Pipeline(stages, microbatches, schedule="gpipe", split_at=None)``.

    S pipeline stages per replica, M micro-batches per step, D = W / S replicas.
    ``schedule``: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"``; ``split_at``: the module
    names the model is cut before (or integer positions of an ``nn.Sequential``).
    """

    name = "pipeline"
    MODULE_OPTIONS = frozenset({"split_at"})

    def __init__(self, stages: int, microbatches: int, schedule: str = "gpipe", split_at: list[str] | None = None):
        super().__init__()
        self.num_stages = _positive("stages", stages)
        self.microbatches = _positive("microbatches", microbatches)
        if schedule not in SCHEDULES:
            raise RingtrainError(f"unknown pipeline schedule {schedule!r}", f"use one of {', '.join(SCHEDULES)}.")
        if schedule == "1f1b" and microbatches < stages:
            # 1F1B needs every stage busy in the steady state (torch's Schedule1F1B refuses it too).
            raise RingtrainError(
                f"schedule={schedule!r} needs at least as many micro-batches as stages, got microbatches={microbatches} "
                f"for stages={stages}",
                f"use microbatches >= {stages} (4x stages keeps the bubble near 20%), or schedule='gpipe'.",
            )
        if schedule == "interleaved":
            rounds = max(1, microbatches // stages)
            if microbatches % rounds:
                raise RingtrainError(
                    f"schedule='interleaved' runs micro-batches in rounds of {stages}; microbatches={microbatches} "
                    "is not a whole number of rounds",
                    f"use a multiple of {stages} micro-batches.",
                )
        self.schedule = schedule
        self.split_at = split_at
        self.pp_group: dist.ProcessGroup | None = None
        self.dp_group: dist.ProcessGroup | None = None
        self._local: list[Stage] = []
        self._all_stages: list[Stage] = []
        self._local_indices: list[int] = []
        self._chunks = 0
        self._param_order: list[str] = []
        self._root_keys: list[str] = []
        self._schedules: dict[tuple, Any] = {}
        self._expected: dict[tuple, list] = {}
        self._key: tuple = ()
        self._sending: set[int] = set()
        self._losses: list[torch.Tensor] = []
        self._loss_fn: Callable | None = None
        self._loss_divisor = 1.0
        self._scaler: torch.amp.GradScaler | None = None

    def __repr__(self) -> str:
        return (f"Pipeline(stages={self.num_stages}, microbatches={self.microbatches}, schedule={self.schedule!r}"
                + (f", split_at={self.split_at!r})" if self.split_at is not None else ")"))

    def check_job(self) -> None:
        if self.env.world_size % self.num_stages:
            raise RingtrainError(
                f"{self.num_stages} pipeline stages do not divide the {self.env.world_size} processes started",
                f"start a multiple of {self.num_stages} processes (W = stages x replicas), or choose stages among the "
                f"divisors of {self.env.world_size}.",
            )
        super().check_job()
        self._replicas = self.env.world_size // self.num_stages
        self.stage_index = self.env.rank // self._replicas

    def configure(self, *, accumulate: int = 1, nonfinite: str = "raise", sync_batchnorm: bool = False) -> None:
        if sync_batchnorm:
            raise RingtrainError(
                "sync_batchnorm=True with strategy='pipeline': each stage holds different BatchNorm layers",
                "drop sync_batchnorm (each stage's BatchNorm sees the whole micro-batch), or use ddp.",
            )

    # --- who and where ------------------------------------------------------
    @property
    def data_parallel_size(self) -> int:
        """Pipeline replicas (W / S): what a loader shards the data over."""
        return self._replicas

    @property
    def data_parallel_rank(self) -> int:
        """This rank's replica: every stage of a replica must see the same batches."""
        return self.rank % self._replicas

    @property
    def is_first_stage(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def setup_environment(self) -> None:
        super().setup_environment()
        stages, replicas = self.num_stages, self.data_parallel_size
        # new_group is collective: every rank creates every group, in the same order.
        for s in range(stages):
            group = dist.new_group([s * replicas + d for d in range(replicas)])
            if s == self.stage_index:
                self.dp_group = group
        for d in range(replicas):
            group = dist.new_group([s * replicas + d for s in range(stages)])
            if d == self.data_parallel_rank:
                self.pp_group = group

    # --- model and optimizer ----------------------------------------------------
    def wrap_module(self, module: nn.Module, split_at: list[str] | None = None, precision: Any = None, **_: Any) -> nn.Module:
        """Cut ``module``, keep this rank's stage(s) on ``self.device``, free the rest; return the local stage.

        With schedule='interleaved' a rank holds several model chunks (rank r: chunks r, r+S, ...,
        torch's "loop" placement) and an ``nn.ModuleList`` of them comes back.
        """
        stages, root = cut(module, split_at if split_at is not None else self.split_at)
        n, s = len(stages), self.num_stages
        if self.schedule == "interleaved" and (n % s or n // s < 2):
            raise RingtrainError(
                f"schedule='interleaved' needs 2 or more model chunks per rank ({2 * s}, {3 * s}, ... in all), "
                f"but the split points make {n}",
                f"give {2 * s - 1} split points for 2 chunks per rank, or use schedule='1f1b'.",
            )
        if self.schedule != "interleaved" and n != s:
            raise RingtrainError(
                f"stages={s} but the split points make {n} stage(s)",
                f"give {s - 1} split point(s) (split_at=[module names]); available names are listed by "
                "`from ringtrain.stages import cuttable_names; cuttable_names(model)`.",
            )
        if self.pp_group is None:
            raise RingtrainError("the pipeline's process groups do not exist yet", "call setup_environment() first (Ring does).")
        self._chunks = n
        self._local_indices = list(range(self.stage_index, n, s))
        self._local = [stages[i] for i in self._local_indices]
        self._all_stages = stages  # the others keep only meta tensors: enough to work out shapes
        self._param_order = [name for name, _ in root.named_parameters()]
        self._root_keys = list(root.state_dict().keys())
        release(root, keep=self._local)
        for stage in self._local:
            stage.to(self.device)
            if precision is not None:
                precision.wrap_forward(stage)  # autocast around each stage forward, float32 out
            stage.register_forward_hook(self._check_shapes)
        self._sending = {id(st) for st, i in zip(self._local, self._local_indices) if i != n - 1}
        # Replicas start equal, whatever each rank's initialisation did (what DDP's constructor does).
        if self.data_parallel_size > 1:
            for stage in self._local:
                for t in (*stage.parameters(), *stage.buffers()):
                    dist.broadcast(t.data, group=self.dp_group, group_src=0)
        self._schedules.clear()
        return self._local[0] if len(self._local) == 1 else nn.ModuleList(self._local)

    def unwrap(self, module: nn.Module) -> nn.Module:
        return module

    def setup_module(self, module: nn.Module, precision: Any, split_at: list[str] | None = None, **_: Any) -> nn.Module:
        # Only this rank's stage goes to the device (the rest is freed); autocast wraps each stage.
        return self.wrap_module(module, split_at=split_at, precision=precision)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, module: nn.Module | None = None) -> torch.optim.Optimizer:
        """Drop the other stages' parameters from ``optimizer`` (built on the whole model), in place.

        Empty parameter groups stay, so every rank's optimizer has the unsplit model's group layout.
        """
        local = {id(p) for stage in self._local for p in stage.parameters()}
        for group in optimizer.param_groups:
            group["params"] = [p for p in group["params"] if id(p) in local]
        for p in [p for p in optimizer.state if id(p) not in local]:
            del optimizer.state[p]
        return optimizer

    # --- the step -----------------------------------------------------------------
    def _check_shapes(self, module: nn.Module, args: Any, output: Any) -> None:
        """Sent stage outputs must keep their shape: the next stage's receive buffers were sized from the first."""
        if id(module) not in self._sending:
            return
        outs = output if isinstance(output, (tuple, list)) else (output,)
        found = [(tuple(t.shape), t.dtype) for t in outs if isinstance(t, torch.Tensor)]
        expected = self._expected.setdefault((self._key, id(module)), found)
        if found != expected:
            raise RingtrainError(
                f"pipeline stage {self.stage_index} output changed shape between micro-batches: "
                f"{expected} first, now {found}",
                "pipeline stages exchange fixed-size buffers, so every micro-batch must give the same shapes: pad "
                "variable-length inputs to a fixed length and avoid data-dependent shapes (boolean masks, "
                "nonzero) at stage boundaries. The next stage waits for this one and stops with it.",
            )

    def _scaled_loss(self, output: Any, target: Any) -> torch.Tensor:
        loss = self._loss_fn(output, target)  # type: ignore[misc]
        self._losses.append(loss.detach())
        loss = loss / (self.microbatches * self._loss_divisor)
        return self._scaler.scale(loss) if self._scaler is not None and self._scaler.is_enabled() else loss

    def _schedule_for(self, key: tuple, x: torch.Tensor) -> Any:
        # One PipelineStage per batch shape: the stages' receive buffers have the shape of the first
        # micro-batch (the last, shorter batch of an epoch gets its own). Every rank of a replica sees
        # the same batch, so all build the same schedules at the same step.
        if key not in self._schedules:
            # Shapes worked out on the meta device put torch's PipelineStage in its static mode (see
            # split.meta_shapes: its dynamic mode would corrupt BatchNorm statistics); None = let torch infer.
            shapes = meta_shapes(self._all_stages, x[: x.shape[0] // self.microbatches])
            problem = dynamic_mode_problem(self._all_stages) if shapes is None else None
            if problem is not None:
                raise problem
            built = []
            for stage, index in zip(self._local, self._local_indices):
                ins, outs = shapes[index] if shapes else (None, None)
                built.append(PipelineStage(stage, index, self._chunks, self.device, input_args=ins, output_args=outs,
                                           group=self.pp_group))
            kind = SCHEDULES[self.schedule]
            arg = built if self.schedule == "interleaved" else built[0]
            self._schedules[key] = kind(arg, self.microbatches, loss_fn=self._scaled_loss, scale_grads=False)
        return self._schedules[key]

    def pipeline_step(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
        *,
        divisor: float = 1,
        sync: bool = True,
        scaler: torch.amp.GradScaler | None = None,
    ) -> torch.Tensor:
        """Forward and backward of one batch through the pipeline; the batch's mean loss, on every rank.

        Every rank of a replica passes the same ``x`` and ``y`` (the whole batch; the schedule cuts
        it into micro-batches). ``divisor``: the accumulation window (the loss is divided by it).
        ``sync``: all-reduce gradients over replicas now (the last step of a window). ``scaler``:
        the fp16 GradScaler, which scales the loss; all ranks then agree on skipping a step.
        """
        if not self._local:
            raise RingtrainError("pipeline_step was called before the model was set up", "call ring.setup(model, optimizer) first.")
        batch = x.shape[0] if x.dim() else 0
        if batch < self.microbatches or batch % self.microbatches:
            raise RingtrainError(
                f"a batch of {batch} samples cannot be cut into {self.microbatches} equal micro-batches",
                f"use a batch size that is a multiple of microbatches={self.microbatches}, and drop_last=True on the "
                "loader when the dataset size is not a multiple of it.",
            )
        self._key = (tuple(x.shape), x.dtype, tuple(y.shape), y.dtype)
        schedule = self._schedule_for(self._key, x)
        self._loss_fn, self._loss_divisor, self._scaler = loss_fn, float(divisor), scaler
        if scaler is not None and scaler.is_enabled():
            # Only the last stage scales a loss, but every rank's GradScaler must hold the same scale
            # to unscale its stage's gradients: scale() is what creates it (lazily), so call it here.
            scaler.scale(torch.zeros((), device=self.device))
        self._losses.clear()
        args = (x.to(self.device),) if 0 in self._local_indices else ()
        target = y.to(self.device) if self._chunks - 1 in self._local_indices else None
        try:
            schedule.step(*args, target=target, return_outputs=False)
        except RuntimeError as e:
            cause = e.__cause__
            if isinstance(cause, RingtrainError):
                raise RingtrainError(cause.message, cause.hint) from e
            raise
        if sync:
            self._all_reduce_grads()
            if scaler is not None and scaler.is_enabled():
                self._agree_on_overflow()
        # The last stage holds the M losses (one more before them if torch inferred shapes itself).
        loss = torch.zeros((), device=self.device)
        if self._losses:
            loss = torch.stack(self._losses[-self.microbatches :]).float().mean()
        dist.broadcast(loss, group=self.pp_group, group_src=(self._chunks - 1) % self.num_stages)
        return loss

    def _grads(self) -> list[torch.Tensor]:
        return [p.grad for stage in self._local for p in stage.parameters() if p.grad is not None]

    def _all_reduce_grads(self) -> None:
        """Average gradients over replicas in one flat buffer; keep replicas' buffers equal (DDP's broadcast_buffers)."""
        if self.data_parallel_size == 1:
            return
        grads = self._grads()
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.dp_group)
            flat /= self.data_parallel_size
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        for stage in self._local:
            for buf in stage.buffers():
                dist.broadcast(buf, group=self.dp_group, group_src=0)

    def _agree_on_overflow(self) -> None:
        """fp16: if any rank's gradients overflowed, make every rank's GradScaler skip this step.

        Each rank's scaler checks only its own stage; planting an inf where another stage overflowed
        makes all skip the step and lower the scale together (public GradScaler behaviour only).
        """
        grads = self._grads()
        local = torch.tensor([float(any(not torch.isfinite(g).all() for g in grads))], device=self.device)
        found = local.clone()
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        if found.item() and not local.item() and grads:
            grads[0].view(-1)[0] = float("inf")

    def clip_grad_norm_(self, module: nn.Module | None, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip every stage's gradients by the norm of the whole model's gradient; return that norm."""
        params = [p for stage in self._local for p in stage.parameters() if p.grad is not None]
        local = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type).to(self.device, torch.float32)
        if norm_type == float("inf"):
            dist.all_reduce(local, op=dist.ReduceOp.MAX, group=self.pp_group)
            total = local
        else:
            powered = local**norm_type
            dist.all_reduce(powered, group=self.pp_group)  # replicas hold equal gradients: sum over stages only
            total = powered ** (1.0 / norm_type)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total

    # --- checkpoints: one unsplit state dict ---------------------------------------
    def _gather_to_main(self, part: Any) -> list[Any] | None:
        """``part`` from replica 0's ranks (one per stage), on rank 0; None elsewhere."""
        mine = part if self.data_parallel_rank == 0 else None
        out: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(mine, out, dst=0)
        return [p for p in out if p is not None] if out is not None else None

    def full_state_dict(self) -> OrderedDict[str, torch.Tensor] | None:
        """The unsplit model's state dict (CPU tensors) on rank 0, None on other ranks. Collective."""
        mine = {k: v.detach().cpu() for stage in self._local for k, v in stage.state_dict().items()}
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
            stage.load_state_dict({k: state_dict[k] for k in own})

    # The Strategy contract's checkpoint hooks: one unsplit state dict, whatever S was.
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
        state = {
            flat[i]: {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in st.items()}
            for i, st in local_sd["state"].items()
        }
        parts = self._gather_to_main(state)
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
        local_state, local_groups, i = {}, [], 0
        for g, saved in zip(optimizer.param_groups, saved_groups):
            ids = []
            for p in g["params"]:
                saved_state = state_dict["state"].get(index[names[id(p)]])
                if saved_state is not None:
                    local_state[i] = saved_state
                ids.append(i)
                i += 1
            local_groups.append({**{k: v for k, v in saved.items() if k != "params"}, "params": ids})
        optimizer.load_state_dict({"state": local_state, "param_groups": local_groups})
