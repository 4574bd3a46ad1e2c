"""The ways of training that the benchmark compares, each as a ``Trainer`` over one workload.

A trainer builds its model (seeded: the same initial weights in every mode), optimizer
and data for one run, then exposes what the runner's timing loop needs: ``batches``
(epochs of batches, with whatever epoch bookkeeping the mode's style requires), ``step``
(one micro-batch; returns the loss and whether the optimizer stepped), the model to
evaluate, and a count of the bytes it communicated.

``RingTrainer`` is ringtrain: one class for every mode, because the script does not
change between modes — only the ``Ring(...)`` arguments do. ``RawDDPTrainer`` is the
hand-written DDP loop the tutorials teach (init_process_group + DistributedSampler +
set_epoch + DDP, autocast + GradScaler for mixed precision): the baseline for
ringtrain's overhead.

Every mode trains the same global batch B per optimizer step: B per step for single,
B/devices per GPU for dp, B/W per rank for ddp/hvd/raw-ddp, B/(W k) per micro-batch with
accumulate=k, B per pipeline replica divided among W/S replicas. fsdp trains as ddp does (B/W per
rank) with each rank holding 1/W of the weights, gradients and optimizer state; its row's peak
memory is the figure to compare with ddp's. ddp+ac is ddp with every repeated block's activations
recomputed in backward (Ring(activation_checkpointing="full")): less peak memory for more compute.
tp cuts the model's Linear layers over pairs of ranks (rt.strategies.DDP(tp=2): both ranks of a pair
take the same B/(W/2) samples, the pairs are DDP replicas of each other).
"""

from __future__ import annotations

import atexit
import contextlib
import io
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import ringtrain as rt

from ..errors import RingtrainError
from ..loop.precision import bf16_problem
from .names import COMPRESSED, MODES, TP_SIZE  # noqa: F401 - MODES: the bench's names, read here by runner and tests
from .workloads import NO_PIPELINE, Workload

PIPELINE_STAGES, PIPELINE_MICROBATCHES = 2, 4
MOMENTUM = 0.9


class Skip(Exception):
    """This mode cannot run here; the message says why (shown in the SKIPPED row)."""


class CommCounter:
    """Counts the gradient all-reduces DDP issues and their bytes, through a DDP communication hook.

    The hook is DDP's own mechanism (``register_comm_hook``) wrapping its default
    all-reduce; both ringtrain's DDP and the raw loop get it, so it costs both the same.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.bytes = 0
        self.method = "none"
        self.hooks: list[Any] = []  # DDP(compression=...)'s own hooks, which count what they send

    def attach(self, model: nn.Module) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        # No annotations here: DDP checks them against dist.GradBucket, and this module's
        # ``from __future__ import annotations`` would turn them into strings.
        def counting(state, bucket):  # noqa: ANN001
            buffer = bucket.buffer()
            self.calls += 1
            self.bytes += buffer.numel() * buffer.element_size()
            return allreduce_hook(state, bucket)

        model.register_comm_hook(None, counting)
        self.method = "ddp comm hook"

    def reset(self) -> None:
        self.calls = self.bytes = 0
        for hook in self.hooks:
            hook.total = hook.calls = 0


def _grad_bytes(model: nn.Module, fp16: bool = False) -> int:
    return sum(p.numel() * (2 if fp16 and p.is_floating_point() else p.element_size())
               for p in model.parameters() if p.requires_grad)


class RingTrainer:
    """The ringtrain script, identical in every mode; ``mode`` only picks the Ring's arguments."""

    def __init__(self, mode: str, wl: Workload, precision: str, device: str, accumulate: int, sync_bn: bool = False):
        kwargs: dict[str, Any] = {"seed": 0, "precision": precision, "device": device}
        if sync_bn:
            kwargs["sync_batchnorm"] = True
        strategy: Any = {"ddp+accumulate": "ddp"}.get(mode, mode)
        if mode == "ddp+accumulate":
            kwargs["accumulate"] = accumulate
        if mode == "hvd+fp16":
            strategy = rt.strategies.Horovod(compression="fp16")
        if mode in COMPRESSED:
            strategy = rt.strategies.DDP(compression=COMPRESSED[mode])
        if mode == "fsdp":
            strategy = rt.strategies.FSDP()
        if mode == "ddp+ac":
            strategy, kwargs["activation_checkpointing"] = "ddp", "full"
        if mode == "tp":
            strategy = rt.strategies.DDP(tp=TP_SIZE)
        if mode == "pipeline":
            if wl.split_at is None:
                raise Skip(f"{wl.name}: {NO_PIPELINE.get(wl.name, 'no split point')}")
            strategy = rt.strategies.Pipeline(stages=PIPELINE_STAGES, microbatches=PIPELINE_MICROBATCHES)
        shown = f"strategy={strategy!r}" + (", sync_batchnorm=True" if sync_bn else "")
        try:
            # ring.print's notes (global batch ...) would be printed once per run: keep stdout for the table.
            with contextlib.redirect_stdout(io.StringIO()):
                self.ring = rt.Ring(strategy=strategy, **kwargs)
        except RingtrainError as e:
            # A mode this machine cannot run (dp without GPUs, more processes than the pipeline's stages
            # divide, ...): said in the table. Any other error is a bug and is raised.
            raise Skip(f"Ring({shown}): {str(e).splitlines()[0]}") from e
        ring = self.ring
        self.pipeline = mode == "pipeline"
        self.wl = wl
        self.sync_bn = sync_bn
        share = PIPELINE_STAGES if self.pipeline else TP_SIZE if mode == "tp" else 1  # ranks fed the same batch
        self.replicas = ring.world_size // share
        devices = self.replicas * ring.strategy.devices_per_process * ring.accumulate
        if wl.global_batch % devices:  # e.g. dp with a GPU count that does not divide the batch
            self.close()
            raise Skip(f"global batch {wl.global_batch} does not split evenly over {devices} micro-batches")
        torch.manual_seed(0)
        model = wl.make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=wl.lr, momentum=MOMENTUM)
        self.grad_bytes = _grad_bytes(model, fp16=mode == "hvd+fp16")
        setup_kwargs = {"split_at": wl.split_at} if self.pipeline else {}
        try:  # (stdout kept for the table: tp's setup prints the plan it applied)
            with contextlib.redirect_stdout(io.StringIO()):
                self.model, self.optimizer = ring.setup(model, optimizer, **setup_kwargs)
        except RingtrainError as e:  # e.g. fsdp refuses 16-mixed: said in the table
            self.close()
            raise Skip(f"ring.setup under {shown}: {str(e).splitlines()[0]}") from e
        with contextlib.redirect_stdout(io.StringIO()):
            self.loader = ring.loader(wl.train, batch_size=wl.global_batch // devices, shuffle=True,
                                      drop_last=self.pipeline)
        # Samples in one micro-batch on this rank count this many times toward the job's total:
        # every stage of a pipeline replica, and both ranks of a tensor-parallel pair, are fed the same batch.
        self.sample_share = 1.0 / share
        self.comm = CommCounter()
        self.sharded = mode == "fsdp"
        self.gathered = mode in ("fsdp", "tp")  # evaluated on a whole model gathered from the ranks' pieces
        hooks = ring.strategy.hooks if isinstance(ring.strategy, rt.strategies.DDP) else None
        if mode == "tp":  # (its pairs' DDP all-reduce would be counted alone: half the story)
            self.comm.method = "not counted: tensor parallelism's activation all-reduces"
        elif hooks:  # a compression hook counts what it sends (comm/traffic.py)
            self.comm.method = "compression hook"
            self.comm.hooks = hooks
        elif isinstance(self.model, DistributedDataParallel):
            self.comm.attach(self.model)
        elif self.sharded:
            self.comm.method = "estimate: all-gather x2 + reduce-scatter of the parameters"
        elif self.pipeline:
            self._count_activations()
        elif mode.startswith("hvd"):
            self.comm.method = "estimate: gradient bytes" + (" at fp16" if mode == "hvd+fp16" else "")
        self.accumulate = ring.accumulate
        self.devices = ring.world_size * ring.strategy.devices_per_process

    def _count_activations(self) -> None:
        """Pipeline traffic: each non-last stage sends its output forward and receives as many gradient bytes back."""
        strategy = self.ring.strategy
        self.comm.method = "stage-boundary activations + their gradients"
        if not isinstance(strategy, rt.strategies.Pipeline) or strategy.is_last_stage:
            return

        def count(module: nn.Module, args: Any, output: Any) -> None:
            if module.training and torch.is_grad_enabled():
                outs = output if isinstance(output, (tuple, list)) else (output,)
                self.comm.bytes += 2 * sum(t.numel() * t.element_size() for t in outs if isinstance(t, torch.Tensor))

        self.model.register_forward_hook(count)

    def comm_per_step(self, steps: int) -> tuple[float | None, float | None]:
        """(bytes, all-reduce calls) per optimizer step on this rank."""
        if self.ring.world_size == 1 and self.ring.strategy.devices_per_process == 1:
            return 0.0, 0.0  # one process, one device: nothing crosses a wire (DDP still calls its hook)
        if self.comm.method == "ddp comm hook":
            return self.comm.bytes / steps, self.comm.calls / steps
        if self.comm.method == "compression hook":
            return sum(h.total for h in self.comm.hooks) / steps, sum(h.calls for h in self.comm.hooks) / steps
        if self.pipeline:  # plus, with several replicas, the stage's gradient all-reduce among them
            replicas = _grad_bytes(self.model) if self.replicas > 1 else 0
            return self.comm.bytes / steps + replicas, float(self.replicas > 1)  # point-to-point sends are no all-reduce
        if self.sharded:  # each step gathers every unit twice (forward, backward) and reduce-scatters its gradients
            world = self.ring.world_size
            return 3.0 * self.grad_bytes * (world - 1) / world, None
        if self.comm.method.startswith("estimate"):
            return float(self.grad_bytes if self.ring.world_size > 1 else 0), None
        return None, None

    def batches(self, epochs: int) -> Iterator[Any]:
        for _ in self.ring.epochs(epochs):  # sets every ring loader's epoch
            yield from self.loader

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, bool]:
        if self.pipeline:
            loss = self.ring.pipeline_step(x, y, self.wl.loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
            return loss, True
        loss = self.wl.loss(self.model(x), y)
        self.ring.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss, self.ring.sync_now

    def close(self) -> None:
        """Let this run's model and optimizer go: the Ring registers ``close`` with atexit, which keeps it alive."""
        self.ring.close()
        atexit.unregister(self.ring.close)

    def eval_model(self) -> nn.Module | None:
        """The whole trained model (same on every rank), or None when this rank holds only a pipeline stage.
        FSDP's shards and tensor parallelism's pieces are gathered (collective) into a fresh model on rank 0."""
        if self.gathered:
            whole = self.ring.strategy.module_state(self.model)
            if whole is None:
                return None
            model = self.wl.make_model()
            if self.sync_bn:
                model = rt.SyncBatchNorm.convert_sync_batchnorm(model)
            model.load_state_dict(whole)
            return model.to(self.ring.device)
        return None if self.pipeline else self.ring.strategy.unwrap(self.model)

    @property
    def device(self) -> torch.device:
        return self.ring.device


class RawDDPTrainer:
    """The DDP loop as the tutorials write it; the process group is already up (init_process_group)."""

    def __init__(self, wl: Workload, precision: str, device: str, sync_bn: bool = False):
        self.wl = wl
        rank, world = dist.get_rank(), dist.get_world_size()
        cuda = device != "cpu" and torch.cuda.is_available()
        local = rank % max(torch.cuda.device_count(), 1)
        self.device = torch.device("cuda", local) if cuda else torch.device("cpu")
        torch.manual_seed(0)
        model = wl.make_model()
        if sync_bn:
            # Seed 004's line, before the DDP wrap. torch's SyncBatchNorm refuses CPU tensors, so on
            # CPU/Gloo the same layer from ringtrain (same statistics, all_reduce over Gloo) stands in.
            model = (nn.SyncBatchNorm if cuda else rt.SyncBatchNorm).convert_sync_batchnorm(model)
        model = model.to(self.device)
        self.grad_bytes = _grad_bytes(model)
        self.model = DistributedDataParallel(model, device_ids=[local] if cuda else None)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=wl.lr, momentum=MOMENTUM)
        self.sampler = DistributedSampler(wl.train, num_replicas=world, rank=rank, shuffle=True, seed=0)
        self.loader = DataLoader(wl.train, batch_size=wl.global_batch // world, sampler=self.sampler, pin_memory=cuda)
        dtype = {"32": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}[precision]
        self.autocast = (lambda: torch.autocast(self.device.type, dtype=dtype)) if dtype else contextlib.nullcontext
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=dtype is torch.float16)
        self.comm = CommCounter()
        self.comm.attach(self.model)
        self.accumulate = 1
        self.sample_share = 1.0
        self.devices = world

    def comm_per_step(self, steps: int) -> tuple[float | None, float | None]:
        if self.devices == 1:
            return 0.0, 0.0  # as RingTrainer's: at W=1 DDP's hook runs, but nothing crosses a wire
        return self.comm.bytes / steps, self.comm.calls / steps

    def batches(self, epochs: int) -> Iterator[Any]:
        for epoch in range(epochs):
            self.sampler.set_epoch(epoch)  # the line everyone forgets once
            for x, y in self.loader:
                yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, bool]:
        self.optimizer.zero_grad()
        with self.autocast():
            loss = self.wl.loss(self.model(x), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss, True

    def close(self) -> None:
        pass

    def eval_model(self) -> nn.Module:
        return self.model.module


def make_trainer(mode: str, wl: Workload, precision: str, device: str, accumulate: int, sync_bn: bool = False):
    if mode == "raw-ddp":
        return RawDDPTrainer(wl, precision, device, sync_bn)
    return RingTrainer(mode, wl, precision, device, accumulate, sync_bn)


def precision_problem(precision: str, device: torch.device) -> str | None:
    """Why ``precision`` cannot run on ``device``, or None. Checked in the ranks: asking needs CUDA initialised."""
    problem = bf16_problem(device) if precision == "bf16-mixed" else None
    if problem:
        return problem
    if precision != "32" and not torch.amp.is_autocast_available(device.type):
        return f"this torch build has no autocast for {device.type}"
    return None


def static_skip(mode: str, world: int, workload: str, cuda_devices: int, accumulate: int, batch: int) -> str | None:
    """Why ``mode`` cannot run with ``world`` processes here, known before starting any process (else None)."""
    if mode == "dp":
        if cuda_devices < 2:
            return (f"DataParallel splits each batch over the GPUs of one process; it needs 2 or more CUDA GPUs "
                    f"and this machine has {cuda_devices}")
        return None
    if cuda_devices and world > cuda_devices:
        return f"{world} processes need {world} GPUs (one each); this machine has {cuda_devices}"
    if mode == "pipeline":
        if workload in NO_PIPELINE:
            return f"{workload}: {NO_PIPELINE[workload]}"
        if world % PIPELINE_STAGES:
            return f"{PIPELINE_STAGES} pipeline stages need a multiple of {PIPELINE_STAGES} processes, got {world}"
        per_replica = batch * PIPELINE_STAGES // world
        if batch % (world // PIPELINE_STAGES) or per_replica % PIPELINE_MICROBATCHES:
            return (f"global batch {batch} gives {per_replica} samples per replica, not a multiple of "
                    f"{PIPELINE_MICROBATCHES} micro-batches")
        return None
    if mode == "tp":
        if world % TP_SIZE:
            return f"tensor parallel over {TP_SIZE} ranks needs a multiple of {TP_SIZE} processes, got {world}"
        if batch % (world // TP_SIZE):
            return f"global batch {batch} does not split into {world // TP_SIZE} tensor-parallel pair(s)"
        return None
    k = accumulate if mode == "ddp+accumulate" else 1
    if mode != "single" and batch % (world * k):
        return f"global batch {batch} does not split into {world} processes x {k} micro-batch(es)"
    return None
