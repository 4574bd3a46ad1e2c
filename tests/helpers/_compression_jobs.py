"""Jobs for the gradient-compression tests (importable by spawned children): an MLP whose gradients
fill several DDP buckets, and the real digits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import ringtrain as rt


def wide_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def wide_data(n: int = 128) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 32, generator=g)
    return TensorDataset(x, (x[:, :4].argmax(dim=1)))


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().cpu().flatten() for p in model.parameters()])


def train_wide(compression, steps: int = 6, bucket_cap_mb: float = 0.01, batch: int = 16) -> dict:
    """A few SGD steps of ``wide_model`` under DDP(compression=...); several buckets (bucket_cap_mb)."""
    strategy = rt.strategies.DDP(compression=compression, bucket_cap_mb=bucket_cap_mb)
    ring = rt.Ring(seed=0, strategy=strategy, device="cpu")
    model = wide_model()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    loader = ring.loader(wide_data(), batch_size=batch, shuffle=True)
    done = 0
    sent = []
    while done < steps:
        for x, y in loader:
            ring.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            sent.append(strategy.bytes_per_step(model))
            done += 1
            if done == steps:
                break
    out = {"params": flat(model), "sent": sent, "chosen": repr(strategy.chosen.compression) if strategy.chosen else None}
    ring.close()
    return out


def digits_split():
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=g)
    test, train = order[:360], order[360:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def digits_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 16, 128), nn.ReLU(), nn.Linear(128, 10))


def digits_accuracy(compression, epochs: int = 6) -> float:
    """Held-out accuracy (%) of a CNN trained on the real digits at 2 ranks under ``compression``."""
    ring = rt.Ring(seed=0, strategy=rt.strategies.DDP(compression=compression), device="cpu")
    train, test = digits_split()
    model = digits_model()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    loader = ring.loader(train, batch_size=32, shuffle=True)
    for _ in ring.epochs(epochs):
        for x, y in loader:
            ring.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    correct = 0
    with torch.no_grad():
        for x, y in ring.loader(test, batch_size=64, exact=True):
            correct += int((model(x).argmax(dim=1) == y).sum())
    total = ring.all_reduce(torch.tensor(float(correct)), op="sum")
    ring.close()
    return 100.0 * float(total) / len(test)
