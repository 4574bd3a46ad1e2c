"""``Ring``: the one object a training script holds.

Data flows one way: the environment (who am I?) chooses and configures a
strategy (how do I run?), which prepares the model, optimizer and loaders the
user's loop then drives. The loop itself is the single-device loop: every method
here is correct on one process (collectives are the identity) and on many.
"""

from __future__ import annotations

import atexit
import weakref
import os
import datetime
import random
from typing import Any, Iterable, Iterator

import numpy as np
import torch
from torch import nn

from . import checkpoint, environments
from .data import RingLoader, make_loader
from .errors import RingtrainError
from .optim import Accumulator, NonFiniteGuard, RingScheduler, wrap_optimizer
from .precision import Precision
from .progress import Progress
from .resume import SaveAndResume
from .strategies import DEFAULT_TIMEOUT_S, choose_strategy
from .strategies.base import BackwardSyncControl, PipelineSchedule
from .strategies.ddp import DDP_OPTIONS


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def _close_if_alive(ring_ref: "weakref.ref[Ring]") -> None:
    ring = ring_ref()
    if ring is not None:
        ring.close()


class Ring(SaveAndResume):
    """Everything a training loop needs to run on one device or many, unchanged.

    ``strategy``: ``"auto"`` (DDP when launched with more than one process, else
    single), ``"single"`` or ``"ddp"``. ``seed`` seeds python/numpy/torch alike
    on every rank. ``backend`` overrides the NCCL/Gloo choice; ``init_method``
    (``env://``, ``tcp://host:port``, ``file:///path``) with ``world_size`` and
    ``rank`` forms a group without a launcher. ``timeout`` (seconds) bounds
    forming the group and every collective. ``device``: ``"auto"``, ``"cpu"``, ``"cuda"``.

    ``accumulate=k`` sums gradients over k micro-batches per optimizer step
    (DDP synchronises only on the k-th); ``precision`` is ``"32"``,
    ``"bf16-mixed"`` or ``"16-mixed"``; ``sync_batchnorm`` converts every
    BatchNorm so statistics cover the global batch; ``deterministic`` turns on
    torch's deterministic algorithms; ``cudnn_benchmark`` (default: on unless
    deterministic) lets cuDNN pick the fastest convolution for fixed shapes.

    ``checkpoint_dir`` with ``save_every=N`` saves every N optimizer steps
    (keeping ``keep_last``), and a ring started again with the same folder —
    e.g. by ``ringtrain run --max-restarts`` after a worker died — resumes from
    the newest complete checkpoint in ``setup``, mid-epoch included.
    ``nonfinite``: what a NaN/inf loss does — ``"raise"`` (stop, naming the
    step), ``"skip"`` (every rank drops that accumulation window's step) or
    ``"ignore"``. ``debug_collectives`` (or ``RINGTRAIN_DEBUG_COLLECTIVES=1``):
    every collective is first checked across ranks, and a rank that calls
    something else or never arrives (within that many seconds if a number is
    given, else 60) is named on every rank.

    ``strategy="pipeline"`` with ``stages``, ``microbatches``, ``schedule``
    (``"gpipe"``, ``"1f1b"``, ``"interleaved"``) and ``split_at`` (module names)
    splits an ``nn.Sequential`` across processes (torch.distributed.pipelining);
    with more processes than stages the replicas are data-parallel. Train with
    ``loss = ring.pipeline_step(x, y, loss_fn)``.

    ``strategy="hvd"`` averages gradients with Horovod's DistributedOptimizer
    (``ringtrain.horovod``'s machinery: hooks, fusion buckets) instead of DDP.
    ``compression="fp16"`` sends gradients as float16 (ddp: DDP's fp16 comm hook;
    hvd: Horovod's ``Compression.fp16``).
    """

    def __init__(
        self,
        strategy: str = "auto",
        *,
        seed: int | None = None,
        backend: str | None = None,
        init_method: str | None = None,
        world_size: int | None = None,
        rank: int | None = None,
        timeout: float | datetime.timedelta = DEFAULT_TIMEOUT_S,
        device: str = "auto",
        accumulate: int = 1,
        precision: str = "32",
        sync_batchnorm: bool = False,
        deterministic: bool = False,
        cudnn_benchmark: bool | None = None,
        checkpoint_dir: str | None = None,
        save_every: int | None = None,
        keep_last: int = 3,
        nonfinite: str = "raise",
        debug_collectives: bool | float = False,
        stages: int | None = None,
        microbatches: int | None = None,
        schedule: str | None = None,
        split_at: list[str] | None = None,
        compression: str = "none",
    ):
        self.strategy = choose_strategy(
            strategy,
            environments.detect(),
            world_size=world_size,
            rank=rank,
            device=device,
            backend=backend,
            init_method=init_method,
            timeout=timeout,
            pipeline={
                k: v
                for k, v in dict(stages=stages, microbatches=microbatches, schedule=schedule, split_at=split_at).items()
                if v is not None
            },
            accumulate=accumulate,
            compression=compression,
        )
        self.env = self.strategy.env
        # Everything the arguments can get wrong is checked before joining the group.
        self.accumulator = Accumulator(accumulate)
        self.precision = Precision(precision, self.device)
        self.nonfinite = NonFiniteGuard(nonfinite, self.strategy)
        if nonfinite == "skip" and self.strategy.name == "hvd":
            raise RingtrainError(
                "nonfinite='skip' with strategy='hvd': a dropped window would leave gradients in flight",
                "use nonfinite='raise' (the default) or 'ignore' with hvd, or strategy='ddp'.",
            )
        if save_every is not None and (not isinstance(save_every, int) or save_every < 1 or checkpoint_dir is None):
            raise RingtrainError(
                f"Ring got save_every={save_every!r} with checkpoint_dir={checkpoint_dir!r}",
                "save_every is a positive number of optimizer steps and needs checkpoint_dir=... to save into.",
            )
        self.checkpoints = checkpoint.CheckpointDir(checkpoint_dir, keep_last) if checkpoint_dir else None
        if sync_batchnorm and isinstance(self.strategy, PipelineSchedule):
            raise RingtrainError(
                "sync_batchnorm=True with strategy='pipeline': each stage holds different BatchNorm layers",
                "drop sync_batchnorm (each stage's BatchNorm sees the whole micro-batch), or use ddp.",
            )
        if debug_collectives is False and os.environ.get("RINGTRAIN_DEBUG_COLLECTIVES", "0") not in ("", "0"):
            debug_collectives = True  # the user's switch, read here and passed on explicitly

        self.strategy.setup_environment()
        # Leave the group at exit, without atexit keeping this ring (and its models) alive.
        atexit.register(_close_if_alive, weakref.ref(self))
        if debug_collectives is not False:
            self.strategy.enable_collective_checks(60.0 if debug_collectives is True else float(debug_collectives))
        self.seed = seed
        if seed is not None:
            seed_everything(seed)
        self.sync_batchnorm = sync_batchnorm
        if deterministic:
            torch.use_deterministic_algorithms(True, warn_only=False)
        if torch.backends.cudnn.is_available():
            torch.backends.cudnn.benchmark = (not deterministic) if cudnn_benchmark is None else cudnn_benchmark
            torch.backends.cudnn.deterministic = deterministic
        self.save_every = save_every
        self._save_due = False
        self._autosave_targets: dict[str, Any] = {}
        if self.checkpoints is not None and self.is_main:
            self.checkpoints.check_writable()
            self.checkpoints.prepare()
        self._models: list[nn.Module] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        self._remaining_batches: int | None = None
        self._sync_off: dict[int, Any] = {}  # open no_sync regions, by id of the wrapped model
        self._loaders: list[RingLoader] = []
        self._loader_resume: list[dict[str, Any]] = []
        self._resume_epoch: int | None = None
        self._epoch: int | None = None
        self._last_loss: torch.Tensor | None = None

    # --- who and where ---------------------------------------------------
    @property
    def rank(self) -> int:
        return self.strategy.rank

    @property
    def local_rank(self) -> int:
        return self.strategy.local_rank

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def node_rank(self) -> int:
        return self.strategy.node_rank

    @property
    def device(self) -> torch.device:
        return self.strategy.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0

    @property
    def accumulate(self) -> int:
        return self.accumulator.k

    @property
    def sync_now(self) -> bool:
        """Did the last ``ring.backward`` end an accumulation window (so the optimizer steps now)?"""
        return self.accumulator.sync_now

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken (accumulation boundaries), counting steps the fp16 scaler skipped."""
        return self.accumulator.optimizer_steps

    @property
    def global_batch_size(self) -> int | None:
        """Samples per optimizer step over the whole job: per-device batch x devices x accumulate."""
        training = [made for made in self._loaders if not made.exact and made.per_device_batch]
        if not training:
            return None
        devices = self.strategy.data_parallel_size * self.strategy.devices_per_process
        return training[0].per_device_batch * devices * self.accumulate

    @property
    def epoch(self) -> int | None:
        """The epoch ``ring.epochs`` is in, or None outside it."""
        return self._epoch

    def __repr__(self) -> str:
        return f"Ring(strategy={self.strategy.name!r}, rank={self.rank}/{self.world_size}, device={self.device})"

    # --- model, optimizer, data ------------------------------------------
    def setup(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        **wrap_kwargs: Any,
    ):
        """Prepare ``model`` (and ``optimizer``, ``scheduler``) for this ring.

        The model gets SyncBatchNorm if asked, moves to the device, runs its
        forward under the precision's autocast, and is wrapped for the strategy;
        every rank starts from rank 0's weights. The optimizer (same object) then
        steps and zeroes gradients only on accumulation boundaries, through the
        fp16 scaler when there is one; the scheduler steps only after a real step.
        ``wrap_kwargs`` go to DistributedDataParallel (find_unused_parameters,
        gradient_as_bucket_view, static_graph, bucket_cap_mb, broadcast_buffers)
        or, as ``split_at``, to the pipeline; each is accepted, unused, by the
        other strategies, so the script stays the same.
        Returns ``model``, ``(model, optimizer)`` or ``(model, optimizer, scheduler)``.
        """
        unknown = set(wrap_kwargs) - DDP_OPTIONS - {"split_at"}
        if unknown:
            raise RingtrainError(
                f"ring.setup got unknown option(s) {sorted(unknown)}",
                f"the options passed to DDP are {sorted(DDP_OPTIONS)}.",
            )
        if not isinstance(model, nn.Module):
            raise RingtrainError(f"ring.setup got a {type(model).__name__}, not an nn.Module", "pass your model.")
        if self.strategy.unwrap(model) is not model or isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            raise RingtrainError(
                f"ring.setup got a model already wrapped in {type(model).__name__}",
                "pass the plain model: the ring wraps it for the strategy it runs.",
            )
        if scheduler is not None and optimizer is None:
            raise RingtrainError("ring.setup got a scheduler without its optimizer", "pass ring.setup(model, optimizer, scheduler).")
        if self.sync_batchnorm:
            from .syncbn import convert_sync_batchnorm

            model = convert_sync_batchnorm(model)
        self._check_same_model(model)
        if not isinstance(self.strategy, PipelineSchedule):
            wrap_kwargs.pop("split_at", None)
        wrapped = self.strategy.setup_module(model, self.precision, **wrap_kwargs)
        self._models.append(wrapped)
        if self.accumulate > 1 and isinstance(self.strategy, BackwardSyncControl):
            wrapped.register_forward_pre_hook(self._before_forward)
        if self.seed is not None:
            # Same weights everywhere came from the shared seed (and DDP's broadcast);
            # from here on each rank draws its own random stream (dropout, augmentation).
            seed_everything(self.seed + self.rank)
        suffix = str(len(self._models) - 1) if len(self._models) > 1 else ""
        targets: dict[str, Any] = {f"model{suffix}": wrapped}
        if optimizer is not None:
            optimizer = self.strategy.setup_optimizer(optimizer, wrapped)
            self._move_optimizer_state(optimizer)
            optimizer = wrap_optimizer(
                optimizer, self.accumulator, self.precision.scaler, self._after_step, self.strategy.step_context
            )
            self._optimizers.append(optimizer)
            targets[f"optimizer{suffix}"] = optimizer
        if scheduler is not None:
            scheduler = RingScheduler(scheduler, self.accumulator)
            targets[f"scheduler{suffix}"] = scheduler
        if self.checkpoints is not None:
            self._autosave_targets.update(targets)
            self._resume_from_checkpoint_dir(targets)
        return (wrapped,) + tuple(t for t in (optimizer, scheduler) if t is not None) if optimizer is not None else wrapped

    def _check_same_model(self, model: nn.Module) -> None:
        """Every rank must hold the same architecture before DDP compares (or hangs on) it."""
        if self.world_size == 1:
            return
        mine = [(name, tuple(p.shape), str(p.dtype)) for name, p in model.named_parameters()]
        everyone = self.strategy.gather_object(mine)
        for rank, theirs in enumerate(everyone):
            if theirs == everyone[0]:
                continue
            first = next(
                (f"{a} on rank 0 vs {b} on rank {rank}" for a, b in zip(everyone[0], theirs) if a != b),
                f"rank 0 has {len(everyone[0])} parameters, rank {rank} has {len(theirs)}",
            )
            raise RingtrainError(
                f"rank {rank} set up a different model than rank 0: first difference: {first}",
                "build the same model (same code and constructor arguments) on every rank before ring.setup.",
            )

    def _move_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":
                    state[key] = value.to(self.device)

    def loader(
        self,
        dataset,
        batch_size: int,
        shuffle: bool = False,
        drop_last: bool = False,
        exact: bool = False,
        **dataloader_kwargs: Any,
    ) -> RingLoader:
        """A DataLoader for this rank: ``batch_size`` samples per device per step.

        Training loaders shard with DistributedSampler (seeded, reshuffled every
        epoch); ``exact=True`` loaders give each sample to exactly one rank, in
        contiguous blocks, so ``ring.all_gather`` of their outputs is in dataset order.
        """
        made = make_loader(
            dataset,
            batch_size=batch_size * self.strategy.devices_per_process,
            shuffle=shuffle,
            drop_last=drop_last,
            exact=exact,
            rank=self.strategy.data_parallel_rank,
            world_size=self.strategy.data_parallel_size,
            seed=self.seed or 0,
            device=self.device,
            **dataloader_kwargs,
        )
        made.per_device_batch = batch_size
        if not exact:
            made.listener = self._note_loader
        first_training = not exact and self.global_batch_size is None
        index = len(self._loaders)
        self._loaders.append(made)
        if first_training and self.global_batch_size != batch_size:
            devices = self.strategy.data_parallel_size * self.strategy.devices_per_process
            self.print(
                f"ringtrain: global batch {self.global_batch_size} = {batch_size} per device x {devices} "
                f"device(s) x {self.accumulate} accumulation step(s)"
            )
        if index < len(self._loader_resume):
            self._resume_loader(made, self._loader_resume[index])
        return made

    def epochs(self, n: int, start: int = 0) -> Iterator[int]:
        """``range(start, n)``, setting the epoch on every loader of this ring; resumes after ``ring.load``."""
        first = start if self._resume_epoch is None else max(start, self._resume_epoch)
        self._resume_epoch = None
        try:
            for epoch in range(first, n):
                self._epoch = epoch
                for made in self._loaders:
                    made.set_epoch(epoch)
                yield epoch
                self.nonfinite.check(force=True)
            if self._save_due:
                self._autosave()
        finally:
            self._epoch = None

    def _note_loader(self, made: RingLoader) -> None:
        """A ring loader is about to hand out a batch; the previous step is complete."""
        self._remaining_batches = made.remaining()
        if self._save_due:
            self._autosave()

    def _remaining(self) -> int | None:
        """Batches left in the loader's pass, counting the one being trained on."""
        return self._remaining_batches

    def _before_forward(self, module: nn.Module, args: Any) -> None:
        """Inside a window, run forward and backward under the strategy's ``no_sync``."""
        if not torch.is_grad_enabled():
            return
        open_region = self._sync_off.pop(id(module), None)
        if open_region is not None:  # a forward whose backward never came (e.g. a skipped batch)
            open_region.__exit__(None, None, None)
        if not self.accumulator.boundary_ahead(self._remaining()):
            region = self.strategy.no_sync(module)  # type: ignore[attr-defined]
            region.__enter__()
            self._sync_off[id(module)] = region

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` done right for accumulation and precision.

        Divides the loss by the accumulation window, scales it for fp16, and
        skips DDP's gradient all-reduce (``no_sync``) on all but the window's
        last micro-batch: one all-reduce per optimizer step, not per micro-batch.
        """
        if isinstance(self.strategy, PipelineSchedule):
            raise RingtrainError(
                "ring.backward under strategy='pipeline': no rank holds the whole model's output",
                "train with loss = ring.pipeline_step(x, y, loss_fn); it runs forward and backward.",
            )
        self.accumulator.check_lr(self._optimizers)
        skip = self.nonfinite.skip(loss, self.optimizer_steps, self._epoch)
        divisor, _ = self.accumulator.next_backward(self._remaining())
        scaled = self.precision.scaler.scale(loss / divisor if divisor > 1 else loss)
        try:
            scaled.backward()
        finally:
            for region in self._sync_off.values():
                region.__exit__(None, None, None)
            self._sync_off.clear()
        if skip:
            self._drop_window()
        self._last_loss = loss.detach()

    def _drop_window(self) -> None:
        # Backward still ran (DDP expects it); its NaNs are wiped and the window's step dropped.
        for model in self._models:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.zero_()
        self.accumulator.drop_window = True

    def pipeline_step(self, x: torch.Tensor, y: torch.Tensor, loss_fn: Any) -> torch.Tensor:
        """Forward and backward of one batch; its mean loss, on every rank.

        With strategy='pipeline' the batch is cut into micro-batches that the
        schedule runs through the stages; elsewhere it is
        ``ring.backward(loss_fn(model(x), y))`` on the model given to ``setup``,
        so the same script runs unsplit.
        """
        if not isinstance(self.strategy, PipelineSchedule):
            loss = loss_fn(self._models[-1](x), y)
            self.backward(loss)
            return loss.detach()
        self.accumulator.check_lr(self._optimizers)
        divisor, boundary = self.accumulator.next_backward(self._remaining())
        loss = self.strategy.pipeline_step(x, y, loss_fn, divisor=divisor, sync=boundary, scaler=self.precision.scaler)
        if self.nonfinite.skip(loss, self.optimizer_steps, self._epoch):
            self._drop_window()
        self._last_loss = loss
        return loss

    def clip_grad_norm_(self, model: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor | None:
        """Clip gradients to ``max_norm`` on accumulation boundaries (unscaling fp16 gradients first).

        Returns the total norm before clipping; between boundaries the gradients
        are still partial sums, nothing is clipped and None is returned.
        """
        if not self.accumulator.sync_now:
            return None
        for optimizer in self._optimizers:
            self.strategy.sync_gradients(optimizer)  # hvd: averaged gradients, before their norm
        scaler = self.precision.scaler
        if scaler.is_enabled():
            for optimizer in self._optimizers:
                scaler.unscale_(optimizer)
        return self.strategy.clip_grad_norm_(model, max_norm, norm_type)

    # --- collectives (identity on one process) ----------------------------
    def all_reduce(self, x: Any, op: str = "mean") -> torch.Tensor:
        return self.strategy.all_reduce(x, op)

    def all_gather(self, x: Any) -> torch.Tensor:
        return self.strategy.all_gather(x)

    def gather_object(self, obj: Any) -> list[Any]:
        return self.strategy.gather_object(obj)

    def broadcast(self, x: Any, src: int = 0) -> torch.Tensor:
        return self.strategy.broadcast(x, src)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return self.strategy.broadcast_object(obj, src)

    def barrier(self) -> None:
        self.strategy.barrier()

    # --- output --------------------------------------------------------------
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only."""
        if self.is_main:
            kwargs.setdefault("flush", True)
            print(*args, **kwargs)

    def progress(self, iterable: Iterable[Any], desc: str | None = None, total: int | None = None) -> Progress:
        """A progress bar (loss, samples/s) on the main process; a pass-through elsewhere."""
        return Progress(
            iterable,
            enabled=self.is_main,
            world_size=self.strategy.data_parallel_size,
            last_loss=lambda: self._last_loss,
            desc=desc,
            total=total,
        )

    # --- lifetime -------------------------------------------------------------
    def close(self) -> None:
        """Leave the process group (also done at exit)."""
        self.strategy.teardown()

    def __enter__(self) -> "Ring":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
