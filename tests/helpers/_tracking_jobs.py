"""Jobs for tests/tracking/ (importable by spawned ranks): ranks that log different values."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import ringtrain as rt
from ringtrain.errors import RingtrainError


def values_of(rank: int, call: int) -> dict:
    """What rank ``rank`` logs at its ``call``-th call: different on every rank, a tensor and a number."""
    g = torch.Generator().manual_seed(1000 * call + rank)
    return {"loss": torch.rand((), generator=g) * (rank + 1), "acc": float(torch.rand((), generator=g)),
            "n": call * 10 + rank}


def log_differently(folder: str) -> dict:
    """Train a few steps through a ring loader, logging rank-dependent values with every reduction."""
    ring = rt.Ring(device="cpu", seed=0, log_dir=folder)
    net = torch.nn.Linear(4, 2)
    net, opt = ring.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    data = torch.utils.data.TensorDataset(torch.randn(128, 4), torch.randint(0, 2, (128,)))
    sent, got, calls = [], [], []
    for _ in ring.epochs(1):
        for x, y in ring.loader(data, batch_size=4):
            ring.backward(F.cross_entropy(net(x), y))
            opt.step()
            opt.zero_grad()
            if ring.optimizer_steps % 2 == 0:
                call = len(sent)
                values = values_of(ring.rank, call)
                reduce = ("mean", "sum", "max", "min", None)[call % 5]
                before = ring.strategy.activity.calls
                got.append(ring.log(values, reduce=reduce))
                calls.append(ring.strategy.activity.calls - before)
                sent.append({k: float(v) for k, v in values.items()})
    # names that differ between the ranks (same count): named on every rank, nothing written
    try:
        ring.log({"loss" if ring.rank == 0 else "lost": 1.0})
        mismatch = None
    except RingtrainError as e:
        mismatch = str(e)
    # a metric only rank 0 logs (issue 31, item 6: the counts differed, and Gloo aborted rank 0)
    try:
        ring.log({"loss": 1.0, **({"acc": 0.5} if ring.rank == 0 else {})})
        only_one = None
    except RingtrainError as e:
        only_one = str(e)
    ring.close()
    return {"sent": sent, "got": got, "calls": calls, "mismatch": mismatch, "only_one": only_one, "steps": ring.optimizer_steps}
