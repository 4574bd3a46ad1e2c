"""``Ring``: the one object a training script holds.

Data flows one way: the environment (who am I?) and the strategy (how do I run?) prepare the model, optimizer and
loaders the user's loop then drives. The loop itself is the single-device loop: every method here is correct on one
process (collectives are the identity) and on many. The Ring coordinates; it asks the strategy what it can do and
never names one (strategies/base.py); saving and resuming is the ``Resumer``'s (resume.py).
"""

from __future__ import annotations

import datetime
from typing import Any, Iterable, Iterator

import torch
from torch import nn

from . import strategies, tracking
from .checkpoint import selfcheck, values
from .checkpoint.resume import Resumer
from .checkpoint.state_files import move_optimizer_state
from .errors import RingtrainError
from .liveness.stall import per_rank_stats
from .loop import loops, precision as precisions, preempt as preempts
from .loop.batches import DrawnBatches
from .loop.data import RingLoader, make_loader
from .loop.plain_loaders import PlainLoaders
from .loop.held import Held
from .loop.optim import (NonFiniteGuard, NoSyncWindow, ReplacedParameters, RingScheduler, ScalerSteps,
                         replace_parameters, wrap_optimizer)
from .loop.progress import Progress
from .loop.seeding import configure_kernels, seed_everything
from .loop.step import Step
from .parallel import contract, environments
from .parallel.group import DEFAULT_TIMEOUT, GroupOptions
from .parallel.syncbn import convert_sync_batchnorm
from .planning import check as plan_checks, mode as planning_mode
from .strategies import BackwardSyncControl, PipelineSchedule, Strategy
from .strategies.compiling import BlockTransforms
from .tracking import timeline as timelines


class Ring:
    """Everything a training loop needs to run on one device or many, unchanged. Its keywords:

    - ``strategy``: ``"auto"`` (DDP when launched with several processes, else one device), a name (``"single"``,
      ``"dp"``, ``"ddp"``, ``"fsdp"``, ``"hvd"``), or an object with its options: ``rt.strategies.FSDP(replicate=2)``.
    - Where: ``device``, ``backend``, ``init_method`` (+ ``world_size``, ``rank``: no launcher needed), ``timeout``
      (seconds, forming the group and every collective).
    - How: ``accumulate`` or ``global_batch`` (samples per optimizer step, all ranks), ``precision`` (``"32"``,
      ``"bf16-mixed"``, ``"16-mixed"``), ``sync_batchnorm``, ``seed``, ``deterministic``, ``cudnn_benchmark``,
      ``activation_checkpointing`` (None, ``"full"``, ``"selective"``), ``compile`` (per block).
    - Checkpoints: ``checkpoint_dir`` + ``save_every`` + ``keep_last`` + ``resume`` (``"auto"``: resumed in ``setup``
      when the configuration is the same; ``"force"``, ``"never"``); ``resume_tolerance`` (``"auto"``: a resumed
      run's first loss equal to the saved run's on the CPU, 1e-4 relative on a GPU; None: off).
    - Preemption (with a folder): SIGTERM, or ``preempt_signal``, saves the step the job is at and exits 75
      (``preempt_grace``: seconds before SIGKILL; ``requeue``: Slurm's).
    - Checks: ``nonfinite`` (``"raise"``, ``"skip"``, ``"ignore"``), ``debug_collectives`` (each collective checked
      across ranks first), ``stall_warning`` (seconds in one collective before the stall report names who has not
      arrived and where: 60, or ``RINGTRAIN_STALL_WARNING``; None: never), ``plan`` (or a plan.json in ``log_dir``:
      step 1's peak memory checked against it). Always: a rank that fails, or finishes while others wait for it,
      ends the job in seconds, named on every rank.
    - Logs: ``log_dir`` (``ring.log``'s run folder), ``log_with`` (``"wandb"``, ``"mlflow"``; TensorBoard whenever
      installed), ``timeline`` (a folder, or ``RINGTRAIN_TIMELINE``: a Chrome trace of every rank and a picture).
    """

    @strategies.refusing_moved_keywords  # Ring(stages=...) of ringtrain 0.1: an error with the new spelling
    def __init__(
        self,
        strategy: str | Strategy = "auto",
        *,
        seed: int | None = None,
        backend: str | None = None,
        init_method: str | None = None,
        world_size: int | None = None,
        rank: int | None = None,
        timeout: float | datetime.timedelta = DEFAULT_TIMEOUT,
        device: str = "auto",
        accumulate: int = 1,
        global_batch: int | None = None,
        precision: Any = "32",
        sync_batchnorm: bool = False,
        deterministic: bool = False,
        cudnn_benchmark: bool | None = None,
        checkpoint_dir: str | None = None,
        save_every: int | None = None,
        keep_last: int = 3,
        resume: str = "auto",
        resume_tolerance: float | None | str = "auto",
        nonfinite: str = "raise",
        debug_collectives: bool | float = False,
        stall_warning: float | None | str = "default",
        timeline: str | None = None,
        log_dir: str | None = None,
        log_with: Iterable[str] = (),
        preempt_signal: Any = None,
        preempt_grace: float | None = None,
        requeue: bool = False,
        activation_checkpointing: Any = None,
        compile: Any = False,
        plan: Any = None,
    ):
        self._plan = planning_mode.request()  # `ringtrain plan` runs this script: setup plans, and the script exits
        if self._plan is not None:  # no group forms, no device is claimed, no folder is written
            strategy, device, checkpoint_dir, log_dir, timeline = self._plan.take(strategy), "cpu", None, None, None
        # The launcher's settings (RINGTRAIN_*), this ring's keywords over them: the one place that decides.
        settings = contract.override(contract.read(), timeline=timeline, preempt_signal=preempt_signal,
                                     preempt_grace=preempt_grace, stall_warning=stall_warning,
                                     debug_collectives=debug_collectives)
        env = environments.with_explicit(environments.detect(), world_size, rank)
        self.strategy = strategies.resolve(strategy, env, init_method=init_method)
        self.strategy.attach(env, GroupOptions.of(device=device, backend=backend, init_method=init_method,
                                                  timeout=timeout, stall_warning=settings.stall_warning))
        self._activity = self.strategy.activity  # what this rank's main thread reports; its watchdog reads it
        self.env = env
        # Everything the arguments can get wrong is checked before joining the group.
        checkpoints = Resumer.checkpoint_dir(checkpoint_dir, save_every, keep_last, resume)
        self._step = Step(accumulate, Resumer.save_every_of(save_every))
        self._memory_check = plan_checks.of(plan, log_dir, self._step, self.strategy, precisions.canonical(precision))
        self._global_batch = Held.check_global_batch(global_batch)
        if global_batch is not None and accumulate != 1:
            raise RingtrainError(f"Ring got both accumulate={accumulate} and global_batch={global_batch}",
                                 "give one: global_batch sets accumulate from the per-device batch and the world size.")
        precision = precisions.canonical(precision)
        self._nonfinite = NonFiniteGuard(nonfinite, self.strategy)
        self.strategy.configure(accumulate=accumulate, nonfinite=nonfinite, sync_batchnorm=sync_batchnorm)
        self.strategy.transform_blocks(BlockTransforms.of(activation_checkpointing, compile))  # per block, in order
        selfcheck.tolerance_of(resume_tolerance, torch.device("cpu"), deterministic)  # checked before the group forms
        preemption = preempts.of(checkpoint_dir, settings, requeue,
                                 given={"preempt_signal": preempt_signal, "preempt_grace": preempt_grace})
        self._log = tracking.RunLog(log_dir, log_with, checkpoint_dir, self._activity)
        timeline = timelines.ring_target(settings.timeline)
        self.strategy.setup_environment()
        self._timeline = timelines.start_for_ring(timeline, env, self._activity)
        self._precision = precisions.Precision(precision, self.device)  # the device is claimed now
        if settings.debug_collectives is not None:
            self.strategy.enable_collective_checks(settings.debug_collectives)
        self._seed = seed if seed is None else seed_everything(seed)
        self._sync_batchnorm = sync_batchnorm
        configure_kernels(deterministic, cudnn_benchmark)
        # What the loop holds (models, optimizers, loaders, the epoch): written here, read by the checkpoints.
        replicas = self.strategy.data_parallel_size
        self._held = Held(self._step, self._precision.scaler, nonfinite=self._nonfinite,
                          devices=replicas * self.strategy.devices_per_process,
                          stages=self.world_size // replicas if isinstance(self.strategy, PipelineSchedule) else 1,
                          extras=values.Extras())
        self._remaining_batches: int | None = None
        no_sync = self.strategy.no_sync if isinstance(self.strategy, BackwardSyncControl) else None
        self._window = NoSyncWindow(self._step, no_sync, lambda: self._remaining_batches)
        self._scaler_steps = ScalerSteps(self._precision.scaler)
        self._step.on_new_window(self._scaler_steps.update)
        self._last_loss: torch.Tensor | None = None
        self._replaced = ReplacedParameters()  # parameters a strategy replaced: an optimizer still on them is named
        self._plain_loaders = PlainLoaders(self.strategy, self._held, self.print)
        self._resumer = Resumer(self.strategy, self._held, checkpoints, resume,  # takes the folder
                                selfcheck.tolerance_of(resume_tolerance, self.device, deterministic))
        if preemption is not None and preemption.install(self.rank, self.local_rank):  # SIGTERM: at a safe point
            self._held.preemption = preemption

    # --- who and where ---------------------------------------------------------
    rank = property(lambda self: self.strategy.rank, doc="This process's rank in the job: 0 .. world_size - 1.")
    local_rank = property(lambda self: self.strategy.local_rank, doc="This process's rank on its node.")
    world_size = property(lambda self: self.strategy.world_size, doc="The number of processes in the job.")
    node_rank = property(lambda self: self.strategy.node_rank, doc="The index of this process's node.")
    device = property(lambda self: self.strategy.device, doc="The device this process trains on (a torch.device).")
    is_main = property(lambda self: self.rank == 0, doc="True on rank 0: the process that prints and writes.")
    is_local_main = property(lambda self: self.local_rank == 0, doc="True on each node's local rank 0.")

    @property
    def accumulate(self) -> int:
        """Micro-batches per optimizer step; settable before the first ``ring.backward`` (a script that derives it
        from the world size: ``ring.accumulate = steps // ring.world_size``)."""
        return self._step.k

    @accumulate.setter
    def accumulate(self, k: int) -> None:
        self._step.set_k(k)
        self.strategy.accumulate_changed(k, self._held.optimizers)

    optimizer_steps = property(lambda self: self._step.optimizer_steps,
                               doc="Optimizer steps taken (accumulation boundaries), counting steps the scaler skipped.")
    sync_now = property(lambda self: self._step.sync_now,
                        doc="Did the last ``ring.backward`` end an accumulation window (so the optimizer steps now)?")
    epoch = property(lambda self: self._held.epoch, doc="The epoch ``ring.epochs`` is in, or None outside it.")
    mesh = property(lambda self: self.strategy.mesh,
                    doc="The job's DeviceMesh (named dimensions: dp_replicate, dp_shard, pp, tp), or None on one process.")

    global_batch_size = property(lambda self: self._held.global_batch, doc=Held.global_batch.__doc__)

    def __repr__(self) -> str:
        return f"Ring(strategy={self.strategy!r}, rank={self.rank}/{self.world_size}, device={self.device})"

    # --- model, optimizer, data ------------------------------------------------
    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
              **options: Any):
        """Prepare ``model`` (and ``optimizer``, ``scheduler``); returns them in that order. The model gets
        SyncBatchNorm if asked, the precision, its device and the strategy's wrap or shards, from rank 0's weights.
        The optimizer (same object) steps and zeroes gradients on accumulation boundaries only, through the fp16
        scaler; the scheduler steps after a real step. ``options`` go to the strategy that understands them."""
        if self._plan is not None:  # planning mode (planning/mode.py): the model's first call is planned
            return self._plan.setup(model, optimizer, scheduler, self._precision)
        strategies.check_setup(self.strategy, model, optimizer, scheduler, options)
        model = convert_sync_batchnorm(model) if self._sync_batchnorm else model
        self._memory_check.before(model)  # step 1's peak against the plan (planning/check.py)
        self.strategy.check_same_model(model)
        mine = {k: v for k, v in options.items() if k in self.strategy.MODULE_OPTIONS}
        originals = dict(model.named_parameters())
        wrapped = self.strategy.setup_module(model, self._precision, **mine)
        # FSDP puts shards in place of the parameters, the meta device real tensors: the optimizer follows.
        replaced = self._replaced.swap(originals, self.strategy.named_parameters(wrapped), given=optimizer)
        self._held.add_model(wrapped, self.strategy.unwrap(wrapped))
        if isinstance(self.strategy, BackwardSyncControl):
            self._window.attach(wrapped)  # no_sync inside windows (ring.accumulate may still be set before training)
        if self._seed is not None:
            # Same weights everywhere came from the shared seed (and the strategy's broadcast); from here on
            # each rank draws its own random stream (dropout, augmentation), a TP group one (seed_rank).
            seed_everything(self._seed + self.strategy.seed_rank)
        suffix = str(len(self._held.models) - 1) if len(self._held.models) > 1 else ""
        targets: dict[str, Any] = {f"model{suffix}": wrapped}
        if optimizer is not None:
            replace_parameters(optimizer, replaced)
            optimizer = self.strategy.setup_optimizer(optimizer, wrapped)
            move_optimizer_state(optimizer, self.device)
            optimizer = wrap_optimizer(optimizer, self._step, self._scaler_steps, self.strategy.step_context,
                                       self._activity)
            self._held.add_optimizer(optimizer, wrapped)
            targets[f"optimizer{suffix}"] = optimizer
        self._memory_check.watch(wrapped, optimizer)
        if scheduler is not None:
            scheduler = RingScheduler(scheduler, self._step)
            targets[f"scheduler{suffix}"] = scheduler
        self._resumer.track(targets)
        self._log.resume_from(self.optimizer_steps)  # rows a killed run logged past its checkpoint are redone
        return (wrapped,) + tuple(t for t in (optimizer, scheduler) if t is not None) if optimizer is not None else wrapped

    def loader(self, dataset, batch_size: int, shuffle: bool = False, drop_last: bool = False, exact: bool = False,
               **dataloader_kwargs: Any) -> RingLoader:
        """A DataLoader for this rank: ``batch_size`` samples per device per step. Training loaders shard with
        DistributedSampler (seeded, reshuffled every epoch); ``exact=True`` loaders give each sample to exactly one
        rank, in contiguous blocks, so ``ring.all_gather`` of their outputs is in dataset order."""
        made = make_loader(
            dataset, batch_size=batch_size * self.strategy.devices_per_process, shuffle=shuffle, drop_last=drop_last,
            exact=exact, rank=self.strategy.data_parallel_rank, world_size=self.strategy.data_parallel_size,
            seed=self._seed or 0, device=self.device, activity=self._activity, **dataloader_kwargs,
        )
        made.per_device_batch, made.listener = batch_size, None if exact else self._note_loader
        first_training = not exact and self.global_batch_size is None
        if first_training and self._global_batch is not None:
            self.accumulate = self._held.accumulate_for(self._global_batch, batch_size)
        self._held.loaders.append(made)
        if first_training:
            self.print(f"ringtrain: global batch {self.global_batch_size} = {self._held.batch_terms(batch_size)} x "
                       f"{self.accumulate} accumulation step(s)")
        self._resumer.add_loader(made)
        return made

    def epochs(self, n: int, start: int = 0) -> Iterator[int]:
        """``range(start, n)``, setting the epoch on every loader of this ring; resumes after ``ring.load``. The top
        of each iteration is a safe point (see ``steps``)."""
        return loops.epochs(self._held, self._activity, self._resumer, n, start)

    def steps(self, n: int) -> Iterator[int]:
        """The optimizer-step numbers, from the one a resumed run continues at, up to ``n``: the loop of a script
        that draws its own batches (``for step in ring.steps(max_steps)``). The top of each iteration is the loop's
        safe point: a due periodic save is written there (a resumed run then repeats exactly what came after it —
        evaluation, logging, random draws), a checkpoint's random state is put back there, and a preemption is
        answered there. Each iteration is one optimizer step: its ring.backward calls, then optimizer.step()."""
        return loops.steps(self._held, self._resumer, n)

    def keep(self, obj: Any, name: str | None = None) -> Any:
        """``obj`` (with ``state_dict()``/``load_state_dict()``: the script's own loader, a sampler, an EMA) rides in
        every checkpoint, each rank's own state, and is loaded back on resume; returns it (checkpoint/per_rank.py)."""
        self._resumer.keep(obj, name)
        return obj

    def batches(self, draw: Any) -> DrawnBatches:
        """``get_batch = ring.batches(get_batch)``: a batch drawn before a checkpoint and trained after it (a prefetch)
        rides in the checkpoint, and a resumed run's first such call gets it back (loop/batches.py)."""
        drawn = DrawnBatches(draw, len(self._held.batches))
        self._resumer.add_batches(drawn)
        return drawn

    def _note_loader(self, made: RingLoader) -> None:  # a ring loader hands out a batch: the last step is done
        self._remaining_batches = made.remaining()
        self._resumer.safe_point()

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` done right for accumulation and precision: divides the loss by the accumulation window,
        scales it for fp16, and skips DDP's gradient all-reduce (``no_sync``) on all but the window's last micro-batch:
        one all-reduce per optimizer step, not per micro-batch."""
        if isinstance(self.strategy, PipelineSchedule):
            raise RingtrainError(
                "ring.backward under strategy='pipeline': no rank holds the whole model's output",
                "train with loss = ring.pipeline_step(x, y, loss_fn); it runs forward and backward.",
            )
        self._step.check_lr(self._held.optimizers)
        self._resumer.safe_point(late=True)  # a loop with no safe point of its own (see steps)
        self._plain_loaders.first_backward()  # a plain DataLoader under data parallelism: said once
        skip = self._nonfinite.skip(loss, self.optimizer_steps, self._held.epoch)
        self._resumer.note_loss(loss)  # the resumed run's self-check (checkpoint/selfcheck.py)
        divisor, _ = self._step.next_backward(self._remaining_batches)
        scaled = self._precision.scaler.scale(loss / divisor if divisor > 1 else loss)
        try:
            with self._activity.timed("backward", "sync"):  # DDP's gradient all-reduce ends here: waiting counts too
                scaled.backward()
        finally:
            self._window.close()
        if skip:
            self._drop_window()
        self._last_loss = loss.detach()

    def _drop_window(self) -> None:
        # Backward still ran (DDP expects it); its NaNs are wiped and the window's step dropped.
        for model in self._held.models:
            model.zero_grad(set_to_none=False)  # zeroes the gradients there are, in place
        self._step.drop()

    def pipeline_step(self, x: torch.Tensor, y: torch.Tensor, loss_fn: Any) -> torch.Tensor:
        """Forward and backward of one batch; its mean loss, on every rank. A pipeline cuts the batch
        into micro-batches through its stages; elsewhere it is ``ring.backward(loss_fn(model(x), y))``."""
        if not isinstance(self.strategy, PipelineSchedule):
            self.backward(loss := loss_fn(self._held.models[-1](x), y))
            return loss.detach()
        self._step.check_lr(self._held.optimizers)
        divisor, boundary = self._step.next_backward(self._remaining_batches)
        loss = self.strategy.pipeline_step(x, y, loss_fn, divisor=divisor, sync=boundary, scaler=self._precision.scaler)
        if self._nonfinite.skip(loss, self.optimizer_steps, self._held.epoch):
            self._drop_window()
        self._last_loss = loss
        return loss

    def clip_grad_norm_(self, model: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor | None:
        """Clip gradients to ``max_norm`` on accumulation boundaries (unscaling fp16 gradients first); the
        total norm before clipping, or None between boundaries (partial sums: nothing is clipped)."""
        if not self._step.sync_now:
            return None
        for optimizer in self._held.optimizers:
            self.strategy.sync_gradients(optimizer)  # hvd: averaged gradients, before their norm
        if self._precision.scaler.is_enabled():
            for optimizer in self._held.optimizers:
                self._precision.scaler.unscale_(optimizer)
        return self.strategy.clip_grad_norm_(model, max_norm, norm_type)

    # --- checkpoints (resume.py) ------------------------------------------------
    def save(self, path: str, *, full: bool | None = None, **state: Any) -> None:
        """Write ``state`` (modules unwrapped, no ``module.`` prefix) to ``path``, whole or not at all, with every rank's
        RNG state and the loaders' positions. Under FSDP a sharded folder every rank writes its part of; elsewhere, or
        with ``full=True``, one ``torch.save`` file gathered on the main process. See ``Resumer.save``."""
        self._resumer.save(path, full=full, **state)

    def load(self, path: str, **targets: Any) -> dict[str, Any]:
        """Load ``path`` into ``targets`` on every rank and continue where it was saved (mid-epoch
        included); ring and plain PyTorch checkpoints alike; returns the other entries. See ``Resumer.load``."""
        extra = self._resumer.load(path, **targets)
        self._log.resume_from(self.optimizer_steps)
        return extra

    # --- collectives: the strategy's (the identity on one process; reduce/gather: None off dst) -----
    def all_reduce(self, x: Any, op: str = "mean") -> torch.Tensor:
        """``x`` (a number or tensor) reduced over every rank by ``op`` ("mean", "sum", "max", "min", "product")."""
        return self.strategy.all_reduce(x, op)

    def reduce(self, x: Any, dst: int = 0, op: str = "mean"):
        """``x`` reduced over every rank onto rank ``dst``; every rank calls it, the others get ``None``."""
        return self.strategy.reduce(x, dst, op)

    def all_gather(self, x: Any) -> torch.Tensor:
        """Every rank's ``x`` concatenated along the first dimension, in rank order (sizes may differ)."""
        return self.strategy.all_gather(x)

    def gather(self, x: Any, dst: int = 0):
        """``all_gather`` onto rank ``dst`` only; every rank calls it, the others get ``None``."""
        return self.strategy.gather(x, dst)

    def gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, as a list in rank order, on every rank."""
        return self.strategy.gather_object(obj)

    def broadcast(self, x: Any, src: int = 0) -> torch.Tensor:
        """Rank ``src``'s tensor ``x`` on every rank."""
        return self.strategy.broadcast(x, src)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s picklable ``obj`` on every rank."""
        return self.strategy.broadcast_object(obj, src)

    def barrier(self) -> None:
        """Wait until every rank has reached this call."""
        self.strategy.barrier()

    # --- output and lifetime -----------------------------------------------------
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only."""
        if self.is_main:
            kwargs.setdefault("flush", True)
            print(*args, **kwargs)

    def log(self, values: dict[str, Any], step: int | None = None, reduce: str | None = "mean") -> dict[str, float]:
        """Log ``values`` (numbers, one-element tensors) for the whole job: reduced over the ranks (``"mean"``, ``"sum"``,
        ``"max"``, ``"min"``; None: rank 0's) in one matrix (names checked first), written once by the main process to the run folder at
        ``step`` (default: the optimizer step, which a resumed log continues from); returns them. See tracking/."""
        return self._log.log(values, self.optimizer_steps if step is None else step, reduce, self.strategy)

    def stats(self) -> dict[int, dict[str, float]]:
        """Per rank (collective): steps, ms/step and the % of a step waiting for data, computing, waiting for the others."""
        return per_rank_stats(dict(enumerate(self.strategy.gather_object(self._activity.times.summary()))))

    def progress(self, iterable: Iterable[Any], desc: str | None = None, total: int | None = None) -> Progress:
        """A progress bar (loss, samples/s) on the main process; a pass-through elsewhere."""
        return Progress(iterable, enabled=self.is_main, world_size=self.strategy.data_parallel_size,
                        last_loss=lambda: self._last_loss, logged=lambda: self._log.latest, desc=desc, total=total)

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The plain module ``ring.setup`` was given (without DDP's or DataParallel's wrapper; FSDP shards in place:
        the same object), e.g. to read ``model.config`` or evaluate on rank 0 without the wrapper's collectives."""
        return self.strategy.unwrap(model)

    @property
    def extras(self) -> dict[str, Any]:
        """The script's own values (``best_val_loss``, ``model_args``, its config...) that every checkpoint carries,
        periodic ones included: set them here; a resumed run finds the checkpoint's here after ``ring.setup``."""
        return self._held.extras

    def close(self) -> None:
        """Write a periodic checkpoint that is due (a loop left with ``break`` right after its step), finish this
        rank's asynchronous checkpoint, if one is being written; leave the process group."""
        self._end(None)

    def __enter__(self) -> "Ring": return self

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None: self._end(error)

    def _end(self, error: BaseException | None) -> None:
        # The one way a ring ends (close, a with block's end); it never waits on peers, and a step that fails
        # here (a due save, this rank's asynchronous one) still leaves everything behind it released.
        failure = error
        try:
            if error is None:
                self._resumer.safe_point()
                self._resumer.flush(agree=False)  # this rank's own writer: no collective on the way out
        except BaseException as e:
            failure = e
            raise
        finally:
            self._replaced.close()
            self._memory_check.close()
            preempts.stop(self._held, settle=failure is None)
            self._log.close()
            timelines.close(self._timeline)
            self._resumer.release(unless_saving=True)  # an asynchronous save still writing keeps the folder
            self.strategy.teardown(failure if isinstance(failure, Exception) else None)
