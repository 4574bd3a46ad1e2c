"""The job of the liveness soaks (tests/liveness/test_soak.py, ``make test-stress``): a healthy loop, no fault.

    ringtrain run --nproc-per-node N _soak_jobs.py [--strategy ddp|fsdp] [--steps S] [--slow-rank R --slow-s T]

A small MLP on synthetic data through a ring loader (``ring.epochs``, stopping after S steps), a ``ring.log`` every
10 steps;
``--slow-rank R --slow-s T``: rank R takes T seconds more per step, outside any collective (slow, never stuck).
Every rank prints ``JOB done rank=r steps=n`` at the end; nothing else is expected from the job.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import ringtrain as rt


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    ring = rt.Ring(args.strategy, seed=0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.05))
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 32, generator=g), torch.randint(0, 4, (4096,), generator=g))
    loader = ring.loader(data, batch_size=16, shuffle=True)
    step = 0
    for _ in ring.epochs(10**6):
        for x, y in loader:
            if ring.rank == args.slow_rank:
                time.sleep(args.slow_s)  # a slow step, not a stuck one
            loss = F.cross_entropy(model(x), y)
            ring.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if step % 10 == 0:
                ring.log({"loss": loss})
            step += 1
            if step >= args.steps:
                break
        if step >= args.steps:
            break
    sys.stdout.write(f"JOB done rank={ring.rank} steps={ring.optimizer_steps}\n")
    sys.stdout.flush()
    ring.close()


if __name__ == "__main__":
    main(sys.argv[1:])
