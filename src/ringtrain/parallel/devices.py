"""Which device a process trains on, and which backend its process group uses.

One rule, decided from what the process can see, with CUDA asked through one small
function (``visible_gpus``) that tests replace:

* ``device="cpu"``, or no GPU visible with ``device="auto"``: the CPU (Gloo).
* at least as many visible GPUs as processes on this node: ``cuda:LOCAL_RANK``
  (``ringtrain run --nproc-per-node gpu``, torchrun, one node of a cluster).
* fewer visible GPUs than processes on this node, but every process sees GPUs of its
  own (Slurm's ``--gpus-per-task=1``, ``CUDA_VISIBLE_DEVICES`` set per process): its
  first GPU, ``cuda:0``. Whether the GPUs are really distinct is asked of the peers
  (their GPU UUIDs, exchanged through the rendezvous store): two processes on one GPU
  would either fail in NCCL ("Duplicate GPU detected") or silently halve its speed.
* otherwise (2 processes, 1 shared GPU): an error with the two ways out.

The default group carries both backends on GPUs, ``"cpu:gloo,cuda:nccl"``: NCCL for CUDA
tensors, Gloo for the CPU tensors of metrics (``ring.all_reduce(3)``), objects and checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from ..errors import RingtrainError

DEVICES = ("auto", "cpu", "cuda")  # and "cuda:N" (a script's own per-process choice), "mps" (one process)


@dataclass(frozen=True)
class Gpus:
    """What this process sees: how many GPUs, and (only when asked for) their UUIDs."""

    count: int
    uuids: Callable[[], tuple[str, ...]] = lambda: ()


def visible_gpus() -> Gpus:
    """The GPUs this process can use (``CUDA_VISIBLE_DEVICES`` applied). ``device_count`` does not
    initialise CUDA; the UUIDs (which do) are read only when the rule needs them."""
    if not torch.cuda.is_available():
        return Gpus(0)
    count = torch.cuda.device_count()
    return Gpus(count, lambda: tuple(str(torch.cuda.get_device_properties(i).uuid) for i in range(count)))


def check_device_name(device: str) -> None:
    """``Ring(device=...)`` names a choice this module knows: auto, cpu, cuda, cuda:N or mps."""
    if device not in DEVICES and device != "mps" and _cuda_index(device) is None:
        raise RingtrainError(f"Ring got device={device!r}", "use 'auto', 'cpu', 'cuda' (or 'cuda:N', 'mps').")


def _cuda_index(device: str) -> int | None:
    kind, _, index = str(device).partition(":")
    return int(index) if kind == "cuda" and index.isdigit() else None


def check_requested(device: str, gpus: Gpus) -> None:
    check_device_name(device)
    if (device == "cuda" or _cuda_index(device) is not None) and gpus.count == 0:
        raise RingtrainError("Ring(device='cuda') was asked for, but torch sees no CUDA device",
                             "use device='auto' (the CPU when there is no GPU); `ringtrain env` shows what torch finds.")


def needs_peers(device: str, local_world_size: int, gpus: Gpus) -> bool:
    """True when the choice depends on which GPUs the other processes on this node see."""
    return device not in ("cpu", "mps") and 0 < gpus.count < local_world_size


def choose_device(device: str, local_rank: int, local_world_size: int, gpus: Gpus,
                  peers: Sequence[Sequence[str]] | None = None) -> torch.device:
    """The device for this process. ``peers``: every local process's GPU UUIDs (see ``needs_peers``)."""
    check_requested(device, gpus)
    if device == "mps":
        return _mps(local_world_size)
    if (index := _cuda_index(device)) is not None:
        # A script's own choice (nanoGPT: f"cuda:{local_rank}"): right when it is the device this rule gives.
        if local_world_size == 1 and index < gpus.count:
            return torch.device("cuda", index)
        if local_world_size > 1 and index == local_rank and gpus.count >= local_world_size:
            return torch.device("cuda", index)
        raise RingtrainError(
            f"Ring(device={device!r}) in local rank {local_rank} of {local_world_size} with {gpus.count} GPU(s) "
            "visible: " + ("that GPU is not visible" if index >= gpus.count else "another process's GPU"),
            "give device='cuda' (ringtrain gives each process its own GPU: cuda:LOCAL_RANK), or 'auto'.")
    if device == "cpu" or gpus.count == 0:
        return torch.device("cpu")
    if gpus.count >= local_world_size:
        return torch.device("cuda", local_rank)
    if peers is not None and all(peers):
        seen = [uuid for mine in peers for uuid in mine]
        if len(seen) == len(set(seen)):
            return torch.device("cuda", 0)  # a GPU of its own, whatever its index on the machine
    raise RingtrainError(
        f"{local_world_size} processes on this node share {gpus.count} GPU(s): local rank {local_rank} has no GPU "
        "of its own",
        "start at most one process per GPU (ringtrain run --nproc-per-node gpu), give each process its own GPU "
        "(CUDA_VISIBLE_DEVICES per process, srun --gpus-per-task=1), or train on CPUs with Ring(device='cpu').",
    )


def _mps(local_world_size: int) -> torch.device:
    if local_world_size > 1:
        raise RingtrainError(f"Ring(device='mps') with {local_world_size} processes on this machine: Apple's GPU "
                             "is one device, and torch.distributed has no backend for it",
                             "run one process (python train.py) with device='mps', or train several on device='cpu'.")
    if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise RingtrainError("Ring(device='mps') was asked for, but this torch sees no Apple GPU (MPS)",
                             "use device='auto' (the CPU here); `ringtrain env` shows what torch finds.")
    return torch.device("mps")


def default_device(requested: str = "auto", gpus: Gpus | None = None) -> torch.device:
    """One process on its own: ``cuda:0`` when a GPU is there (or asked for), else the CPU."""
    gpus = visible_gpus() if gpus is None else gpus
    return choose_device(requested, 0, 1, gpus)


def choose_backend(device: torch.device, requested: str | None, available: Callable[[str], bool] | None = None) -> str:
    """The backend string for ``init_process_group``; ``requested`` wins where it can work."""
    available = available or _available
    cuda = device.type == "cuda"
    if requested is None:
        return "cpu:gloo,cuda:nccl" if cuda and available("nccl") else "gloo"
    if requested not in ("gloo", "nccl", "mpi"):
        raise RingtrainError(f"backend={requested!r} is not a torch.distributed backend", "use 'gloo', 'nccl' or 'mpi'.")
    if not available(requested):
        raise RingtrainError(
            f"backend={requested!r} was asked for, but this torch build does not include it",
            "use backend='gloo' (CPU) or 'nccl' (CUDA); 'mpi' needs torch built from source against MPI.",
        )
    if requested == "nccl":
        if not cuda:
            raise RingtrainError(
                "backend='nccl' was asked for, but this process has no CUDA device",
                "use backend='gloo' on CPUs, or run on a machine with one GPU per process.",
            )
        return "cpu:gloo,cuda:nccl"  # CPU tensors (metrics, objects) still need a way through
    return requested


def _available(name: str) -> bool:
    return {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available, "mpi": dist.is_mpi_available}[name]()
