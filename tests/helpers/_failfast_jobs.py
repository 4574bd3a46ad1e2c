"""Jobs in which rank 1 leaves, every way a rank can leave, while rank 0 keeps calling collectives.

    python _failfast_jobs.py API MODE          (as a script: ringtrain run, torchrun, by hand)
    ringtrain.launch(_failfast_jobs.job, 2, args=(API, MODE))

API: ``ring`` (rt.Ring, DDP), ``ring-hvd`` (rt.Ring(strategy="hvd")), ``ring-fsdp`` (rt.Ring(strategy="fsdp")), ``hvd`` (the Horovod API:
``import horovod.torch as hvd`` under ``ringtrain run --horovod``, ringtrain.horovod otherwise),
``plain`` (torch.distributed and DDP by hand, no ringtrain).

MODE (what rank 1 does at step 3): ``raise`` (ValueError), ``exit3`` (sys.exit(3)), ``memory``
(MemoryError), ``raise-slow-exit`` (ValueError, and its exit takes 3 s — an atexit handler, as a
data loader or a logger shutting down: the rank it stops is gone first), ``before-setup`` (raises between Ring() and ring.setup, ring APIs only), ``nan``
(a NaN loss with nonfinite="raise", ring APIs only), ``return`` (finishes early and cleanly),
``close`` (ring.close() and lingers, ring APIs only), ``kill`` (SIGKILLs itself).

Rank 1 prints ``FAULT rank=1 t=<time.time()>`` just before it leaves; rank 0 trains on for at
most ``RANK0_SECONDS`` and then prints ``NOT STOPPED`` — the fail-fast tests fail on it.
"""

from __future__ import annotations

import os
import signal
import sys
import time

RANK0_SECONDS = 90.0
FAULT_STEP = 3


def _fault(mode: str, stage: str) -> None:
    """Rank 1's departure, the ``mode`` way (``stage``: where in the script we are)."""
    print(f"FAULT rank=1 t={time.time():.3f} mode={mode}", flush=True)
    if mode == "raise-slow-exit":
        import atexit

        atexit.register(lambda: (time.sleep(3.0), print("SLOW EXIT DONE", flush=True)))
    if mode in ("raise", "raise-slow-exit"):
        raise ValueError(f"rank one fails on purpose ({stage})")
    if mode == "exit3":
        sys.exit(3)
    if mode == "memory":
        raise MemoryError("rank one is out of memory on purpose")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError(f"mode {mode} is not a departure by itself")


def _rank0_done(start: float) -> bool:
    if time.monotonic() - start > RANK0_SECONDS:
        print("NOT STOPPED: rank 0 trained on after its peer left", flush=True)
        return True
    return False


def _train(rank: int, mode: str, model, optimizer) -> str:
    """The loop of the scripts that train by hand (hvd, plain): rank 1 leaves at FAULT_STEP."""
    import torch
    import torch.nn.functional as F

    x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
    start = time.monotonic()
    for step in range(100_000):
        if rank == 1 and step == FAULT_STEP:
            if mode == "return":
                print(f"FAULT rank=1 t={time.time():.3f} mode=return", flush=True)
                return "rank 1 finished early"
            _fault(mode, "in the training loop")
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if rank == 0 and _rank0_done(start):
            return "rank 0 was never stopped"
        time.sleep(0.02)
    return "unreachable"


def ring_job(mode: str, strategy: str = "ddp") -> str:
    import torch
    import torch.nn.functional as F

    import ringtrain as rt

    # FAILFAST_CHECKPOINT_DIR: a ring that answers SIGTERM with a checkpoint (preemption) must fail as fast
    folder = os.environ.get("FAILFAST_CHECKPOINT_DIR")
    ring = rt.Ring(strategy=strategy, nonfinite="raise", seed=0,
                   checkpoint_dir=os.path.join(folder, str(os.getpid())) if folder else None)
    if ring.rank == 1 and mode == "before-setup":
        _fault("raise", "before ring.setup")
    model = torch.nn.Linear(8, 2)
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
    start = time.monotonic()
    for step in range(100_000):
        if ring.rank == 1 and step == FAULT_STEP:
            if mode == "return":
                print(f"FAULT rank=1 t={time.time():.3f} mode=return", flush=True)
                return "rank 1 finished early"
            if mode == "close":
                print(f"FAULT rank=1 t={time.time():.3f} mode=close", flush=True)
                ring.close()
                time.sleep(30)
                return "rank 1 closed early"
            if mode == "nan":
                print(f"FAULT rank=1 t={time.time():.3f} mode=nan", flush=True)
                ring.backward(F.cross_entropy(model(x), y) * float("nan"))
            else:
                _fault(mode, "in the training loop")
        loss = F.cross_entropy(model(x), y)
        ring.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        ring.all_reduce(loss.detach())
        if ring.rank == 0 and _rank0_done(start):
            return "rank 0 was never stopped"
        time.sleep(0.02)
    return "unreachable"


def hvd_job(mode: str) -> str:
    import torch

    try:
        import horovod.torch as hvd  # ringtrain run --horovod: ringtrain's alias package
    except ImportError:
        import ringtrain.horovod as hvd

    hvd.init()
    model = torch.nn.Linear(8, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    # "return" is MONAI's tutorial: one rank finds no data and finishes at once.
    return _train(hvd.rank(), mode, model, optimizer)


def plain_job(mode: str) -> str:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return _train(rank, mode, model, optimizer)


def job(api: str, mode: str) -> str:
    if api == "ring":
        return ring_job(mode)
    if api == "ring-hvd":
        return ring_job(mode, strategy="hvd")
    if api == "ring-fsdp":
        return ring_job(mode, strategy="fsdp")
    if api == "hvd":
        return hvd_job(mode)
    if api == "plain":
        return plain_job(mode)
    raise ValueError(f"unknown api {api!r}")


if __name__ == "__main__":
    print(job(sys.argv[1], sys.argv[2]), flush=True)
