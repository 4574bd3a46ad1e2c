"""Jobs for tests/test_stress.py: as functions for ringtrain.launch, and as a script for ringtrain run.

    python _stress_jobs.py plain|ring OUT.pt     (ringtrain run --nproc-per-node 2 ...)
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(32, 10, generator=g), torch.randint(0, 3, (32,), generator=g)


def save_close_cycles(folder: str, n: int, first: int) -> list[int]:
    """``n`` cycles of: a new Ring, a few DDP steps, ring.save, ring.close — in these two processes."""
    import ringtrain as rt

    done = []
    x, y = _data()
    for cycle in range(first, first + n):
        ring = rt.Ring(seed=cycle, device="cpu")
        model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        for _ in range(3):
            ring.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
        ring.save(os.path.join(folder, "cycle.pt"), model=model, optimizer=optimizer)
        ring.close()
        done.append(cycle)
    return done


def plain(out: str) -> None:
    """What the tutorials write: init, DDP, train, save on rank 0, destroy_process_group."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(10, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _data()
    for _ in range(5):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), out)
    dist.destroy_process_group()


def ring(out: str) -> None:
    import ringtrain as rt

    ring_ = rt.Ring(seed=0, device="cpu")
    model = torch.nn.Linear(10, 3)
    model, optimizer = ring_.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = _data()
    for _ in range(5):
        ring_.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    ring_.save(out, model=model)


if __name__ == "__main__":
    {"plain": plain, "ring": ring}[sys.argv[1]](sys.argv[2])
