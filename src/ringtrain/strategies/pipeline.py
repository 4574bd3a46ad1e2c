"""Pipeline parallelism across processes, with data parallelism across pipeline replicas.

The schedule is torch's own (``torch.distributed.pipelining``: ``PipelineStage``
with ``ScheduleGPipe``, ``Schedule1F1B`` or ``ScheduleInterleaved1F1B``); the
process group is the service every distributed strategy uses (parallel/group.py). This file adds what a training loop needs
around them: cutting the model by module name (stages.py), keeping only this
rank's stage in memory, a step that returns the loss on every rank, data
parallelism over replicas, global-norm clipping, and full (unsplit) checkpoints.

Layout (W = S x D ranks): the job's device mesh (mesh.py) is ``("pp", S)`` then the data
strategy's dimensions over D — ``("dp_replicate", D)`` for ``data=DDP()`` (the default),
``("dp_shard", D)`` for ``data=FSDP()`` — so rank = stage * D + replica, the pipeline dimension
outermost, as torchtitan's ``["pp", "dp"]`` mesh and Megatron-LM's rank order put it: a stage's
data-parallel peers are neighbouring ranks (same node when a node holds D or more).
``mesh["pp"]`` carries the schedule's point-to-point traffic; on the data sub-mesh each stage is
torch's DistributedDataParallel, or FSDP2 (``fully_shard``: each of the D ranks of a stage holds
1/D of it), which torch's ``PipelineStage`` drives (DDP's no_sync between micro-batches, FSDP's
reduce-scatter after the last). The loader shards by ``data_parallel_rank`` /
``data_parallel_size``: every stage of a replica sees the same batches (stage 0 uses x, the
last stage y).

Numerics: the schedule runs with ``scale_grads=False`` and the loss of each
micro-batch divided by M (and by the accumulation window), so a step's
gradient is that of the mean loss over the whole batch — exactly as the unsplit
model computes it — and gradients of several steps add up correctly
(torch's ``scale_grads=True`` would divide already-accumulated gradients again).
Gradient accumulation = several ``pipeline_step`` calls before ``optimizer.step``; torch's
stage reduces gradients over the replicas at the end of every call (the sum of the calls'
averages is the average of their sum, so the result is exact; raising M is the cheaper way to
a larger batch, since it also shrinks the bubble).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..checkpoint import state
from ..errors import RingtrainError
from ..parallel.mesh import PP, Layout
from ..parallel.stages import Stage, cut, dynamic_mode_problem, meta_copy, meta_shapes, release
from . import materialize
from ._pipeline_state import StageCheckpoints
from .base import Distributed, PipelineSchedule, StageData
from .ddp import DDP
from .fsdp import FSDP

# torch's schedule classes by name; torch.distributed.pipelining (and torch._dynamo with it: ~2 s of import) is
# loaded when a pipeline builds its first schedule, not by every script that imports ringtrain's strategies.
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B"}


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RingtrainError(f"pipeline got {name}={value!r}", f"{name} is a positive integer.")
    return value


def _data_strategy(data: Any) -> StageData:
    """``data=``: a strategy that composes with a pipeline (the ``StageData`` contract), or its name."""
    if data is None or data == "ddp":
        return DDP()
    if data == "fsdp":
        return FSDP()
    if isinstance(data, StageData):
        return data
    raise RingtrainError(f"Pipeline got data={data!r}",
                         "use data=rt.strategies.DDP() (the default: each stage replicated) or data=rt.strategies.FSDP() "
                         "(each stage sharded over its replicas), the names 'ddp' / 'fsdp', or a strategy of your own "
                         "that implements rt.strategies.StageData.")


class Pipeline(StageCheckpoints, Distributed, PipelineSchedule):
    """``rt.strategies.Pipeline(stages, microbatches, schedule="gpipe", split_at=None, data=DDP())``.

    S pipeline stages per replica, M micro-batches per step, D = W / S replicas.
    ``schedule``: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"``; ``split_at``: the module
    names the model is cut before (or integer positions of an ``nn.Sequential``); ``data``: how
    a stage's D replicas share it — ``rt.strategies.DDP()`` (each holds it whole) or
    ``rt.strategies.FSDP()`` (each holds 1/D of it: a 2-D pipeline x FSDP layout).
    """

    name = "pipeline"
    MODULE_OPTIONS = frozenset({"split_at"})

    def __init__(self, stages: int, microbatches: int, schedule: str = "gpipe", split_at: list[str] | None = None,
                 data: Any = None):
        super().__init__()
        self.data = _data_strategy(data)
        self._data_given = data is not None and data != "ddp"  # shown by repr
        self.shards_state = self.data.shards_state
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
        self._local: list[Stage] = []  # this rank's stages, as the user's modules (FSDP shards them in place)
        self._names_at_wrap: dict[int, str] = {}  # id of a local parameter as the user built it -> its name
        self._runners: list[nn.Module] = []  # what the schedule runs: each local stage, DDP-wrapped when replicated
        self._all_stages: list[Stage] = []  # every stage, for working out shapes (meta tensors where not local)
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
                + (f", split_at={self.split_at!r}" if self.split_at is not None else "")
                + (f", data={self.data!r})" if self._data_given else ")"))

    def check_job(self) -> None:
        if self.env.world_size % self.num_stages:
            raise RingtrainError(
                f"{self.num_stages} pipeline stages do not divide the {self.env.world_size} processes started",
                f"start a multiple of {self.num_stages} processes (W = stages x replicas), or choose stages among the "
                f"divisors of {self.env.world_size}.",
            )
        self.data.dims_over(self.env.world_size // self.num_stages)  # refuses what does not divide
        super().check_job()
        self.stage_index = self.layout().coordinates(self.env.rank)[PP]

    def layout(self) -> Layout:
        """("pp", S), then the data strategy's dimensions over the D = W / S replicas of each stage."""
        return Layout(((PP, self.num_stages), *self.data.dims_over(self.world_size // self.num_stages)))

    @property
    def data_mesh(self) -> Any:
        """The sub-mesh of this stage's replicas (1-D, or 2-D for FSDP(replicate=k)), with its ``tp`` dimension
        innermost under data=FSDP(tp=N) (the stage is cut over ``mesh["tp"]``, sharded over the rest)."""
        names = tuple(n for n in self.layout().names if n != PP)
        return self.mesh[names if len(names) > 1 else names[0]]

    def transform_blocks(self, transforms: Any) -> None:
        # The stages' shapes are worked out by running them on meta tensors first: a compiled block would compile
        # for those.
        transforms.refuse_compile("a pipeline", "drop compile=True under rt.strategies.Pipeline (activation "
                                  "checkpointing works: each stage's blocks are checkpointed).")
        super().transform_blocks(transforms)

    def step_context(self, optimizer: torch.optim.Optimizer) -> Any:
        """data=FSDP(tp=N): the TP drift guard checks the stage's replicated parameters after the first step."""
        tp = getattr(self.data, "tp", None)
        return tp.guards.after_step(optimizer) if tp is not None else contextlib.nullcontext()

    def configure(self, *, accumulate: int = 1, nonfinite: str = "raise", sync_batchnorm: bool = False) -> None:
        if sync_batchnorm:
            raise RingtrainError(
                "sync_batchnorm=True with strategy='pipeline': each stage holds different BatchNorm layers",
                "drop sync_batchnorm (each stage's BatchNorm sees the whole micro-batch), or use ddp.",
            )

    # --- who and where (data_parallel_rank/size: the mesh's data dimensions) ---------
    @property
    def is_first_stage(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def setup_environment(self) -> None:
        super().setup_environment()  # the mesh: its sub-meshes carry the pipeline's and the replicas' groups
        self.pp_group = self.mesh[PP].get_group()

    # --- model and optimizer ----------------------------------------------------
    def wrap_module(self, module: nn.Module, split_at: list[str] | None = None, precision: Any = None, **_: Any) -> nn.Module:
        """Cut ``module``, keep this rank's stage(s) on ``self.device``, free the rest; return the local stage.

        With schedule='interleaved' a rank holds several model chunks (rank r: chunks r, r+S, ...,
        torch's "loop" placement) and an ``nn.ModuleList`` of them comes back.
        """
        self.blocks.apply(module)  # the whole model's blocks, before the cut and the stages' shards (compiling.py)
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
                "`from ringtrain.parallel.stages import cuttable_names; cuttable_names(model)`.",
            )
        if self.pp_group is None:
            raise RingtrainError("the pipeline's process groups do not exist yet", "call setup_environment() first (Ring does).")
        self._chunks = n
        self._local_indices = list(range(self.stage_index, n, s))
        self._local = [stages[i] for i in self._local_indices]
        self._param_order = [name for name, _ in root.named_parameters()]
        self._root_keys = list(root.state_dict().keys())
        self._names_at_wrap = {id(p): n for stage in self._local for n, p in stage.named_parameters()}
        meta = materialize.on_meta(module)
        if meta:  # built on the meta device: only this rank's stage(s) are ever allocated
            materialize.check(module)
            rng = materialize.rank0_rng_state(self.broadcast_object)
        release(root, keep=self._local)
        sharded = self.data.shards_state
        # Shapes are worked out on meta tensors (stages.meta_shapes); a sharded stage's own forward would
        # gather its shards, so it is worked out on a meta copy made before sharding.
        self._all_stages = [meta_copy(st) if sharded and i in self._local_indices else st for i, st in enumerate(stages)]
        for stage in self._local:
            self.data.place_stage(stage, mesh=self.data_mesh, device=self.device, precision=precision, meta=meta,
                                  broadcast=self._from_first_replica)
            stage.register_forward_hook(self._check_shapes)  # after autocast's: it sees what is sent
        if meta:
            materialize.materialize(root, rng)  # every stage in order: the random stream of the whole model
        self._sending = {id(st) for st, i in zip(self._local, self._local_indices) if i != n - 1}
        # What the schedule runs: the data strategy's stage on the stage's data sub-mesh (DDP's replicas, FSDP's shards).
        self._runners = [self.data.run_stage(stage, mesh=self.data_mesh, device=self.device) for stage in self._local]
        self._schedules.clear()
        return self._runners[0] if len(self._runners) == 1 else nn.ModuleList(self._runners)

    def _from_first_replica(self, tensor: torch.Tensor) -> None:
        """Give ``tensor`` the first replica's values on every replica of this stage (each data dimension in turn)."""
        for name in self.data_mesh.mesh_dim_names:
            dist.broadcast(tensor, group=self.mesh[name].get_group(), group_src=0)

    def unwrap(self, module: nn.Module) -> nn.Module:
        return module

    def setup_module(self, module: nn.Module, precision: Any, split_at: list[str] | None = None, **_: Any) -> nn.Module:
        # Only this rank's stage goes to the device (the rest is freed); autocast wraps each stage.
        return self.wrap_module(module, split_at=split_at, precision=precision)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, module: nn.Module | None = None) -> torch.optim.Optimizer:
        """Drop the other stages' parameters from ``optimizer`` (built on the whole model), in place.

        Empty parameter groups stay, so every rank's optimizer has the unsplit model's group layout.
        """
        current = self.named_parameters(None)
        local = {id(p) for p in current.values()}
        for group in optimizer.param_groups:
            # A stage's parameters that FSDP replaced by shards (or the meta device by real tensors) are
            # found by name; ring.setup has usually done that already (optim.replace_parameters).
            group["params"] = [p if id(p) in local else current[self._names_at_wrap[id(p)]]
                               for p in group["params"] if id(p) in local or id(p) in self._names_at_wrap]
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
            from torch.distributed import pipelining  # noqa: PLC0415 - heavy: loaded by a pipeline only (above)

            built = []
            for runner, index in zip(self._runners, self._local_indices):
                ins, outs = shapes[index] if shapes else (None, None)
                built.append(pipelining.PipelineStage(runner, index, self._chunks, self.device, input_args=ins, output_args=outs,
                                           group=self.pp_group))
            kind = getattr(pipelining, SCHEDULES[self.schedule])
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
        if sync and scaler is not None and scaler.is_enabled():
            self._agree_on_overflow()
        # The last stage holds the M losses (one more before them if torch inferred shapes itself).
        loss = torch.zeros((), device=self.device)
        if self._losses:
            loss = torch.stack(self._losses[-self.microbatches :]).float().mean()
        dist.broadcast(loss, group=self.pp_group, group_src=(self._chunks - 1) % self.num_stages)
        return loss

    def _grads(self) -> list[torch.Tensor]:
        return [p.grad for stage in self._local for p in stage.parameters() if p.grad is not None]

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
        # FSDP stages: a norm over DTensor shards is reduced over the replicas' shards already.
        local = state.full_tensor(torch.nn.utils.get_total_norm([p.grad for p in params], norm_type))
        local = local.to(self.device, torch.float32)
        if norm_type == float("inf"):
            dist.all_reduce(local, op=dist.ReduceOp.MAX, group=self.pp_group)
            total = local
        else:
            powered = local**norm_type
            dist.all_reduce(powered, group=self.pp_group)  # replicas hold equal gradients: sum over stages only
            total = powered ** (1.0 / norm_type)
        if any(state.is_sharded(p.grad) for p in params):
            coef = min(1.0, max_norm / (float(total) + 1e-6))  # a DTensor takes a number, not a plain tensor
            for p in params:
                p.grad.mul_(coef)
        else:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total
