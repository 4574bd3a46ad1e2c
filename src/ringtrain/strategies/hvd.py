"""Horovod-style data parallelism: the model stays unwrapped, the optimizer averages gradients.

Instead of wrapping the module in DistributedDataParallel, this strategy wraps the
optimizer in ringtrain's DistributedOptimizer (``ringtrain.comm``, the machinery
behind ``ringtrain.horovod``): hooks reduce gradient buckets while backward runs,
``optimizer.step()`` waits for them. Gradient accumulation maps to
``backward_passes_per_step``; fp16 compression halves the bytes on the wire.
The process group is the service every distributed strategy uses (parallel/group.py).
Cross-rank checks of the gradient path are off unless ``enable_collective_checks``
(``Ring(debug_collectives=...)``) turns them on, as for the ring's other collectives.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from .. import comm
from ..comm import DEFAULT_FUSION_THRESHOLD, Compression
from ..comm.store_check import StoreRows
from ..errors import RingtrainError
from .base import Distributed

COMPRESSIONS = {"none": Compression.none, "fp16": Compression.fp16, "bf16": Compression.bf16}


def compression_of(value) -> type:
    """``"none"`` / ``"fp16"`` / ``"bf16"`` / a Compressor class -> the Compressor class."""
    if isinstance(value, str):
        if value not in COMPRESSIONS:
            raise RingtrainError(f"compression={value!r}", f"use one of {sorted(COMPRESSIONS)} or a Compressor class.")
        return COMPRESSIONS[value]
    if not (hasattr(value, "compress") and hasattr(value, "decompress")):
        raise RingtrainError(f"compression={value!r} has no compress/decompress",
                             "pass 'none', 'fp16', 'bf16', or a class like ringtrain.comm.Compression.fp16.")
    return value


class Horovod(Distributed):
    """``rt.strategies.Horovod(compression="none", fusion_threshold=64 MiB)``: Horovod's DistributedOptimizer.

    The model stays unwrapped; the optimizer averages gradients in fused buckets while
    backward runs. ``compression``: ``"none"``, ``"fp16"``, ``"bf16"`` or a Compressor class.
    ``check=True`` checks every gradient synchronisation across ranks first (also turned on
    by ``Ring(debug_collectives=...)``).
    """

    name = "hvd"

    def __init__(self, *, compression: Any = "none", fusion_threshold: int = DEFAULT_FUSION_THRESHOLD,
                 check: bool = False):
        super().__init__()
        if isinstance(fusion_threshold, bool) or not isinstance(fusion_threshold, int) or fusion_threshold < 0:
            raise RingtrainError(f"Horovod got fusion_threshold={fusion_threshold!r}",
                                 "give a number of bytes per gradient bucket (0: one bucket per tensor).")
        self.compression = compression_of(compression)
        self.fusion_threshold = fusion_threshold
        self.check = check
        self.backward_passes_per_step = 1
        # Every rank, as a process set of this strategy's own: its check rounds, checker and verified
        # gradient layout are this strategy's, not ``ringtrain.horovod``'s global set's (a script
        # may use both), and nothing here changes what the other uses (docs/architecture.md,
        # principle 13: each strategy owns its process set). ``bind`` makes its engine groups once
        # the process group exists.
        self.process_set = comm.ProcessSet(None)

    def __repr__(self) -> str:
        name = next((k for k, v in COMPRESSIONS.items() if v is self.compression), self.compression.__name__)
        return f"Horovod(compression={name!r})" if name != "none" else "Horovod()"

    def configure(self, *, accumulate: int = 1, nonfinite: str = "raise", sync_batchnorm: bool = False) -> None:
        if nonfinite == "skip":
            raise RingtrainError(
                "nonfinite='skip' with strategy='hvd': a dropped window would leave gradients in flight",
                "use nonfinite='raise' (the default) or 'ignore' with hvd, or strategy='ddp'.",
            )
        # Ring(accumulate=k) -> backward_passes_per_step=k: gradients travel once per window.
        self.backward_passes_per_step = accumulate

    def accumulate_changed(self, accumulate: int, optimizers: list[torch.optim.Optimizer]) -> None:
        self.backward_passes_per_step = accumulate
        for optimizer in optimizers:  # the DistributedOptimizers already made: gradients travel once per window
            optimizer.set_backward_passes_per_step(accumulate)

    def setup_environment(self) -> None:
        super().setup_environment()
        self.process_set.bind()  # its gradient group, and under NCCL a Gloo twin for CPU tensors
        self.process_set.activity = self.activity  # a ring's timeline hears its gradient buckets

    def enable_collective_checks(self, timeout: float) -> None:
        """Ring(debug_collectives=...): the ring's collectives and every gradient synchronisation are
        checked across ranks first, through the store (a rank that never arrives is named)."""
        super().enable_collective_checks(timeout)
        self.process_set.checker = StoreRows(self.group.check_store(), timeout, prefix="hvd-check")
        self.check = True

    def wrap_module(self, module: nn.Module, **options: Any) -> nn.Module:
        """The module itself, with rank 0's parameters and buffers on every rank (DDP's options do not apply)."""
        comm.broadcast_parameters(module.state_dict(), 0, process_set=self.process_set, check=self.check)
        return self.blocks.apply(module)

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module, backward_passes_per_step: int = 1,
                       compression="none", op=comm.ReduceOp.AVERAGE) -> torch.optim.Optimizer:
        """A DistributedOptimizer over ``model``'s parameters, starting from rank 0's optimizer state."""
        wrapped = comm.distributed_optimizer(
            optimizer, list(model.named_parameters()), compression=compression_of(compression),
            backward_passes_per_step=backward_passes_per_step, op=op, process_set=self.process_set,
            fusion_threshold=self.fusion_threshold, check=self.check,
        )
        comm.broadcast_optimizer_state(wrapped, 0, process_set=self.process_set, check=self.check)
        return wrapped

    # --- the Strategy contract: the Ring's optimizer is a DistributedOptimizer ------------
    def setup_optimizer(self, optimizer: torch.optim.Optimizer, module: nn.Module) -> torch.optim.Optimizer:
        return self.wrap_optimizer(optimizer, module, backward_passes_per_step=self.backward_passes_per_step,
                                   compression=self.compression)

    def sync_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        # Horovod's recipe for clipping or loss scaling: synchronize(), then step in skip_synchronize().
        if comm.is_distributed(optimizer) and not getattr(optimizer, "_synchronized", False):
            optimizer.synchronize()

    def step_context(self, optimizer: torch.optim.Optimizer):
        if not comm.is_distributed(optimizer) or not hasattr(optimizer, "_sync"):
            return contextlib.nullcontext()  # Adasum's delta optimizer combines inside step()
        self.sync_gradients(optimizer)
        return optimizer.skip_synchronize()
