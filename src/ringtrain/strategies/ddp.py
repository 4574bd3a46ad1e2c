"""DistributedDataParallel: one process per device, on one node or many.

The gradient all-reduce is torch's own (``DistributedDataParallel`` and its comm
hooks); the process group is the service in _group.py. This file holds DDP's options
and wraps the module.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from .. import timeline
from ..errors import RingtrainError
from ..stages import spans_devices
from .base import BackwardSyncControl, Distributed

COMPRESSIONS = ("none", "fp16")


class DDP(Distributed, BackwardSyncControl):
    """``rt.strategies.DDP(...)``: torch's DistributedDataParallel, one process per device.

    The keyword options are DistributedDataParallel's own (``find_unused_parameters``,
    ``gradient_as_bucket_view``, ``static_graph``, ``bucket_cap_mb``, ``broadcast_buffers``),
    plus ``compression="fp16"`` (DDP's fp16 comm hook: gradients travel as float16).
    ``ring.setup(model, optimizer, find_unused_parameters=True)`` still works and wins.
    """

    name = "ddp"
    MODULE_OPTIONS = frozenset(
        {"find_unused_parameters", "gradient_as_bucket_view", "static_graph", "bucket_cap_mb", "broadcast_buffers"}
    )
    backward_syncs = True

    def __init__(self, *, compression: str = "none", **ddp_options: Any):
        super().__init__()
        if compression not in COMPRESSIONS:
            raise RingtrainError(f"DDP got compression={compression!r}", f"use one of {', '.join(COMPRESSIONS)}.")
        unknown = set(ddp_options) - self.MODULE_OPTIONS
        if unknown:
            raise RingtrainError(f"DDP got unknown option(s) {sorted(unknown)}",
                                 f"DistributedDataParallel's options are {sorted(self.MODULE_OPTIONS)}.")
        self.compression = compression
        self.ddp_options = ddp_options

    def wrap_module(self, module: nn.Module, **options: Any) -> nn.Module:
        if not any(p.requires_grad for p in module.parameters()):
            raise RingtrainError(
                f"{type(module).__name__} has no trainable parameters, so DDP has nothing to synchronise",
                "pass the model you train to ring.setup, or use ring.setup only for trainable models.",
            )
        return self.replicate(module, None, self.device, **options)

    def replicate(self, module: nn.Module, group: Any, device: Any, **options: Any) -> DistributedDataParallel:
        """``module`` (on ``device``) as torch's DistributedDataParallel over ``group`` (None: the whole job);
        a pipeline replicates each stage over its data sub-mesh with it."""
        # A module on several devices (model parallel inside each process) must leave device_ids
        # unset (DistributedDataParallel's documented rule for multi-device modules).
        device_ids = [device.index] if device.type == "cuda" and not spans_devices(module) else None
        # DDP broadcasts the group's first rank's parameters and buffers on construction, so every
        # rank starts from the same weights whatever its own initialisation did.
        wrapped = DistributedDataParallel(module, device_ids=device_ids, process_group=group,
                                          **{**self.ddp_options, **options})
        # fp16: DDP's own hook, gradients travel as float16 and come back in their dtype.
        hook = default_hooks.fp16_compress_hook if self.compression == "fp16" else None
        hook = timeline.comm_hook(hook)  # a timeline records each bucket's all-reduce (None: DDP's built-in)
        if hook is not None:
            wrapped.register_comm_hook(group, hook)
        return wrapped

    def unwrap(self, module: nn.Module) -> nn.Module:
        return module.module if isinstance(module, DistributedDataParallel) else module

    def no_sync(self, module: nn.Module) -> ContextManager:
        if isinstance(module, DistributedDataParallel):
            return module.no_sync()
        return contextlib.nullcontext()

    def __repr__(self) -> str:
        options = {**self.ddp_options, **({"compression": self.compression} if self.compression != "none" else {})}
        return f"DDP({', '.join(f'{k}={v!r}' for k, v in options.items())})"
