"""DistributedDataParallel: one process per device, on one node or many.

The process group and the gradient all-reduce are torch's own
(``init_process_group`` and ``DistributedDataParallel``); this file only chooses
the backend and device the way the PyTorch docs recommend, turns the engine's
failures to meet into errors that say what to do, and wraps the module.
"""

from __future__ import annotations

import contextlib
import datetime
import time
import socket
from typing import Any, ContextManager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.rendezvous import rendezvous
from torch.nn.parallel import DistributedDataParallel

from .. import collectives
from ..environments import Environment
from ..errors import RingtrainError
from .base import BackwardSyncControl, Strategy
from .single import default_device

# The keyword arguments of DistributedDataParallel that ring.setup passes through.
DDP_OPTIONS = frozenset(
    {"find_unused_parameters", "gradient_as_bucket_view", "static_graph", "bucket_cap_mb", "broadcast_buffers"}
)


def choose_backend(device: torch.device, requested: str | None) -> str:
    """NCCL when each process has a CUDA device, Gloo otherwise; ``requested`` wins if available."""
    if requested is None:
        return "nccl" if device.type == "cuda" and dist.is_nccl_available() else "gloo"
    available = {
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "mpi": dist.is_mpi_available(),
    }
    if requested not in available:
        raise RingtrainError(f"backend={requested!r} is not a torch.distributed backend", "use 'gloo', 'nccl' or 'mpi'.")
    if not available[requested]:
        raise RingtrainError(
            f"backend={requested!r} was asked for, but this torch build does not include it",
            "use backend='gloo' (CPU) or 'nccl' (CUDA); 'mpi' needs torch built from source against MPI.",
        )
    if requested == "nccl" and device.type != "cuda":
        raise RingtrainError(
            "backend='nccl' was asked for, but this process has no CUDA device",
            "use backend='gloo' on CPUs, or run on a machine with one GPU per process.",
        )
    return requested


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DDPStrategy(Strategy, BackwardSyncControl):
    name = "ddp"

    def __init__(
        self,
        env: Environment,
        *,
        device: str = "auto",
        backend: str | None = None,
        init_method: str | None = None,
        timeout: datetime.timedelta = datetime.timedelta(minutes=30),
        compression: str = "none",
    ):
        super().__init__(env)
        if compression not in ("none", "fp16"):
            raise RingtrainError(f"Ring got compression={compression!r}", "use 'none' or 'fp16'.")
        self.compression = compression
        self._device = default_device(env.local_rank, device)
        if self._device.type == "cuda":
            count = torch.cuda.device_count()
            if env.local_rank >= count:
                raise RingtrainError(
                    f"local rank {env.local_rank} needs cuda:{env.local_rank}, but this node has {count} GPU(s)",
                    "start at most one process per GPU (ringtrain run --nproc-per-node gpu), "
                    "or train on CPUs with Ring(device='cpu').",
                )
        self.backend = choose_backend(self._device, backend)
        if init_method is None and env.name == "single":
            # DDP asked for in a plain `python train.py`: a group of one on a free loopback port.
            init_method = f"tcp://127.0.0.1:{free_port()}"
        self.init_method = init_method or env.default_init_method()
        self.timeout = timeout
        self._owns_group = False
        self.store: dist.Store | None = None

    @property
    def device(self) -> torch.device:
        return self._device

    def setup_environment(self) -> None:
        # Each process claims its own GPU before anything touches CUDA, or every
        # rank's context lands on cuda:0 (PyTorch DDP notes, "one GPU per process").
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)
        if dist.is_initialized():
            if dist.get_world_size() != self.world_size:
                raise RingtrainError(
                    f"a process group of size {dist.get_world_size()} already exists, "
                    f"but this ring expects world size {self.world_size}",
                    "create the Ring before calling init_process_group yourself, or let the Ring create it.",
                )
            return
        where = self.init_method
        try:
            # The same rendezvous init_process_group would do, done here so the ring keeps
            # the store: collective checks (debug_collectives) exchange descriptors in it.
            store, _, _ = next(rendezvous(self.init_method, self.rank, self.world_size, timeout=self.timeout))
            store.set_timeout(self.timeout)
            dist.init_process_group(
                backend=self.backend,
                store=store,
                world_size=self.world_size,
                rank=self.rank,
                timeout=self.timeout,
                **({"device_id": self._device} if self._device.type == "cuda" else {}),
            )
            self.store = dist.PrefixStore("ringtrain", store)
        except (RuntimeError, ValueError, TimeoutError, OSError) as e:
            seconds = int(self.timeout.total_seconds())
            raise RingtrainError(
                f"rank {self.rank} of {self.world_size} could not form the process group at {where} "
                f"within {seconds}s ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
                "check that every rank was started with the same world size and master address/port, that the "
                "master (rank 0) is running and reachable from this host, and that the port is not in use by "
                "another job; lower Ring(timeout=...) to fail faster.",
            ) from e
        self._owns_group = True

    def enable_collective_checks(self, timeout: float) -> None:
        if self.store is None:
            raise RingtrainError(
                "debug_collectives needs the rendezvous store, but this ring joined a process group made elsewhere",
                "let the Ring create the process group (do not call init_process_group yourself).",
            )
        self.checker = collectives.Checker(self.store, self.rank, self.world_size, timeout)

    def teardown(self) -> None:
        if self._owns_group and dist.is_initialized():
            # Gloo's worker threads drop their last tensors after a collective completes,
            # and dropping one needs the GIL. If the group is then destroyed from Python
            # (here, or later when DDP's reducer is freed) while one of them still waits
            # for the GIL, ~ProcessGroupGloo joins that thread with the GIL held: a
            # deadlock (seen under gdb: Reducer::~Reducer -> ~ProcessGroupGloo ->
            # thread::join while pt_gloo_runloop waits in decref_pyobject). A barrier makes
            # every earlier collective finished on all ranks, and the short sleep releases
            # the GIL so the worker threads can finish with their tensors.
            with contextlib.suppress(RuntimeError):
                dist.barrier()
            time.sleep(0.05)
            dist.destroy_process_group()
        self._owns_group = False
        # Drop the store client now, not during interpreter shutdown, where destroying its
        # threads late can abort the process ("terminate called without an active exception").
        self.checker = None
        self.store = None

    def wrap_module(self, module: nn.Module, **wrap_kwargs: Any) -> nn.Module:
        if not any(p.requires_grad for p in module.parameters()):
            raise RingtrainError(
                f"{type(module).__name__} has no trainable parameters, so DDP has nothing to synchronise",
                "pass the model you train to ring.setup, or use ring.setup only for trainable models.",
            )
        device_ids = [self._device.index] if self._device.type == "cuda" else None
        # DDP broadcasts rank 0's parameters and buffers on construction, so every
        # rank starts from the same weights whatever its own initialisation did.
        wrapped = DistributedDataParallel(module, device_ids=device_ids, **wrap_kwargs)
        if self.compression == "fp16":
            # DDP's own hook: gradients travel as float16 and come back in their dtype.
            wrapped.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return wrapped

    def unwrap(self, module: nn.Module) -> nn.Module:
        return module.module if isinstance(module, DistributedDataParallel) else module

    def no_sync(self, module: nn.Module) -> ContextManager:
        if isinstance(module, DistributedDataParallel):
            return module.no_sync()
        return contextlib.nullcontext()
