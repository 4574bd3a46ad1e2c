"""What the seeds leave as ``model = ...`` and ``dataset = ...``, filled in small for a CPU.

The twins in this folder import their model, data and optimizer from here so that each
twin shows only what its seed block shows; the tests import the same pieces to compute
the single-process result independently (``reference``). ``report`` is the twins' one
test hook: with ``TWIN_OUT`` set, rank 0 writes its final parameters and losses there.
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import TensorDataset

FEATURES, CLASSES, SAMPLES = 8, 4, 64


def dataset(samples: int = SAMPLES) -> TensorDataset:
    """Points labelled by a fixed linear teacher: learnable in a few dozen SGD steps."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, FEATURES, generator=g)
    teacher = torch.randn(FEATURES, CLASSES, generator=g)
    return TensorDataset(x, (x @ teacher).argmax(1))


class Net(nn.Module):
    """A two-layer MLP; ``batchnorm=True`` puts a BatchNorm1d between the layers."""

    def __init__(self, batchnorm: bool = False):
        super().__init__()
        torch.manual_seed(0)  # the same start on every rank and in the tests' reference
        self.module1 = nn.Sequential(nn.Linear(FEATURES, 32), nn.BatchNorm1d(32) if batchnorm else nn.Identity(), nn.ReLU())
        self.module2 = nn.Linear(32, CLASSES)

    def forward(self, x):
        return self.module2(self.module1(x))


def sequential(batchnorm: bool = False) -> nn.Sequential:
    """``Net`` as an nn.Sequential (what rt.split and pipelines cut), same parameters and start."""
    net = Net(batchnorm)
    return nn.Sequential(net.module1, net.module2)


class LARS(torch.optim.Optimizer):
    """Layer-wise adaptive rate scaling (You et al. 2017), as SwAV trains with it: SGD with
    momentum whose step for each tensor is scaled by eta * |w| / |g + wd * w|. (SwAV: eta=0.001
    for a ResNet-50; a larger trust coefficient suits this small net.)"""

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, eta=0.02):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad.add(p, alpha=group["weight_decay"])
                w_norm, d_norm = p.norm(), d.norm()
                if w_norm > 0 and d_norm > 0:
                    d = d.mul(group["eta"] * w_norm / d_norm)
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(d)
                p.add_(buf, alpha=-group["lr"])


def report(model: nn.Module, losses: list[float], rank: int = 0) -> None:
    """Test hook (not in any seed): rank 0 saves its parameters and losses to $TWIN_OUT."""
    out = os.environ.get("TWIN_OUT")
    if out and rank == 0:
        model = getattr(model, "module", model)  # DDP / DataParallel wrap the model
        state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        torch.save({"params": state, "losses": losses}, out)


def report_orders(orders: list[list[int]], rank: int) -> None:
    """Test hook (not in any seed): each rank saves the sample names it drew, epoch by epoch."""
    out = os.environ.get("TWIN_OUT")
    if out:
        torch.save(orders, f"{out}.rank{rank}")
