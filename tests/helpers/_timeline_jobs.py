"""Jobs for tests/test_timeline.py: a small DDP loop that records a timeline (importable by spawned ranks)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import ringtrain as rt

STEPS = 6


def model() -> nn.Module:
    # ~27 KB of float32 gradients: with bucket_cap_mb=0.01 DDP cuts them into several buckets.
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def train(folder: str, compression: str = "none", steps: int = STEPS) -> dict:
    torch.manual_seed(0)
    ring = rt.Ring(strategy=rt.strategies.DDP(compression=compression, bucket_cap_mb=0.01), seed=0,
                   device="cpu", timeline=folder)
    net = model()
    net, optimizer = ring.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    data = torch.utils.data.TensorDataset(torch.randn(16 * steps, 32), torch.randint(0, 10, (16 * steps,)))
    for _ in ring.epochs(1):
        for x, y in ring.loader(data, batch_size=8):
            ring.backward(F.cross_entropy(net(x), y))
            optimizer.step()
            optimizer.zero_grad()
    total = ring.all_reduce(torch.tensor(1.0), op="sum")  # a user collective, on the timeline
    ring.close()
    return {"rank": ring.rank, "total": float(total)}


def horovod(path: str, steps: int = STEPS) -> int:
    """A Horovod script's loop: hvd.start_timeline(path) ... hvd.stop_timeline()."""
    import os

    import ringtrain.horovod as hvd

    os.environ["HOROVOD_FUSION_THRESHOLD"] = "10000"  # bytes: several buckets for this small model
    hvd.init()
    torch.manual_seed(0)
    net = model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                         named_parameters=net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    hvd.start_timeline(path)
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(net(x), y).backward()
        optimizer.step()
    hvd.stop_timeline()
    buckets = len(optimizer._sync.buckets)
    hvd.shutdown()
    return buckets
