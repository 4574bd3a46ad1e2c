"""SyncBatchNorm jobs: run inside real Gloo process groups (importable by spawned children),
plus the single-process references they are compared with.

The equivalence set-up (docs/architecture.md, "Tests"): rank r holds rows ``sizes[r]`` of one big
batch; the single process holds all of them. Each rank's loss is ``(y_r * g_r).sum() * W / N``
(for equal batches: the mean over its own b rows, as a DDP script computes it) and the
single process's is ``(y * g).sum() / N``. Then, as with DDP:

* the parameter gradients, averaged over the W ranks (what DDP does), equal the single
  process's parameter gradients;
* each rank's input gradient is W times the single process's on the same rows (each rank
  differentiates its own loss, whose scale is W times its share of the global mean).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

import ringtrain as rt
from ringtrain.parallel.syncbn import SyncBatchNorm, convert_sync_batchnorm

C = 3
STEPS = 3  # forward/backward steps: running stats (and momentum=None's average) move each step
TAILS = {"1d_nc": (), "1d_ncl": (7,), "2d": (4, 5), "3d": (3, 2, 4)}
PLAIN = {"1d_nc": nn.BatchNorm1d, "1d_ncl": nn.BatchNorm1d, "2d": nn.BatchNorm2d, "3d": nn.BatchNorm3d}


def plain_layer(kind: str, momentum: float | None = 0.1, affine: bool = True) -> nn.Module:
    layer = PLAIN[kind](C, momentum=momentum, affine=affine)
    if affine:  # not the default 1/0, so a missing or misplaced weight shows
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            layer.weight.copy_(torch.rand(C, generator=g) + 0.5)
            layer.bias.copy_(torch.randn(C, generator=g))
    return layer


def batch(kind: str, n: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Input (mean 3, std 2: a shift that E[x^2]-E[x]^2 in float32 would feel) and upstream grad."""
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(n, C, *TAILS[kind], generator=g, dtype=torch.float64).float() * 2 + 3
    return x, torch.randn(x.shape, generator=g)


def _run(layer: nn.Module, kind: str, rows: slice, n_total: int, loss_scale: float, device="cpu") -> dict:
    """STEPS training steps on ``rows`` of each step's batch, then one eval forward (results on CPU)."""
    layer.to(device)
    for step in range(STEPS):
        x, g = batch(kind, n_total, step)
        x, g = x[rows].to(device).requires_grad_(), g[rows].to(device)
        if layer.weight is not None:
            layer.weight.grad = layer.bias.grad = None
        y = layer(x)
        ((y * g).sum() * loss_scale).backward()
    layer.eval()
    x_eval, _ = batch(kind, n_total, STEPS)
    return {
        "y": y.detach().cpu(),
        "x_grad": x.grad.cpu(),
        "w_grad": None if layer.weight is None else layer.weight.grad.cpu(),
        "b_grad": None if layer.bias is None else layer.bias.grad.cpu(),
        "running_mean": layer.running_mean.cpu(),
        "running_var": layer.running_var.cpu(),
        "num_batches_tracked": int(layer.num_batches_tracked),
        "eval_y": layer(x_eval[rows].to(device)).detach().cpu(),
    }


def reference(kind: str, sizes: tuple[int, ...], momentum: float | None = 0.1, affine: bool = True) -> dict:
    """One process, plain BatchNorm, the whole batch, loss = mean over it."""
    n = sum(sizes)
    return _run(plain_layer(kind, momentum, affine), kind, slice(0, n), n, 1.0 / n)


def equivalence(kind: str, sizes: tuple[int, ...], momentum: float | None = 0.1, affine: bool = True) -> dict:
    """This rank's share of ``reference``, through a converted SyncBatchNorm."""
    ring = rt.Ring()
    layer = convert_sync_batchnorm(plain_layer(kind, momentum, affine))
    assert isinstance(layer, SyncBatchNorm)
    n, start = sum(sizes), sum(sizes[: ring.rank])
    out = _run(layer, kind, slice(start, start + sizes[ring.rank]), n, ring.world_size / n, ring.device)
    ring.close()
    return out


def equivalence_cases(cases: list[tuple]) -> list[dict]:
    """``equivalence`` for each ``(kind, sizes, momentum, affine)`` in one process group (one start-up)."""
    ring = rt.Ring()
    out = [equivalence(*case) for case in cases]  # each joins the same group, already formed
    ring.close()
    return out


def low_precision_and_untracked(sizes: tuple[int, ...] = (3, 5)) -> dict:
    """bfloat16 input (statistics still accumulated in float32+), and track_running_stats=False."""
    ring = rt.Ring()
    start = sum(sizes[: ring.rank])
    rows = slice(start, start + sizes[ring.rank])
    x, _ = batch("2d", sum(sizes), 0)
    half = convert_sync_batchnorm(plain_layer("2d"))
    y_half = half(x.bfloat16()[rows])
    untracked = convert_sync_batchnorm(nn.BatchNorm2d(C, track_running_stats=False))
    out = {
        "y_bf16": y_half.detach(),
        "running_mean": half.running_mean.clone(),
        "running_var": half.running_var.clone(),
        "y_untracked": untracked(x[rows]).detach(),
    }
    untracked.eval()  # no running stats: batch statistics, local (torch's rule), no communication
    out["y_untracked_eval"] = untracked(x[rows]).detach() if ring.rank == 0 else None
    ring.close()
    return out


def eval_one_rank(timeout_s: float) -> dict:
    """Train one synchronised step, then ONLY rank 0 evaluates (rank 1 leaves): must not talk or hang.

    A short collective timeout turns a wrongly synchronised eval into an error, not a hang.
    """
    ring = rt.Ring(timeout=timeout_s)
    layer = convert_sync_batchnorm(plain_layer("2d"))
    x, _ = batch("2d", 8, 0)
    layer(x[4 * ring.rank : 4 * ring.rank + 4])  # both ranks: synchronised training step
    out: dict = {"rank": ring.rank}
    if ring.rank == 0:
        layer.eval()
        x_eval, _ = batch("2d", 4, 1)
        start = time.monotonic()
        for _ in range(5):
            y = layer(x_eval)
        out["seconds"] = time.monotonic() - start
        expected = F.batch_norm(x_eval, layer.running_mean, layer.running_var, layer.weight, layer.bias, False)
        out["max_err"] = float((y - expected).abs().max())
        # Frozen-BN fine-tuning: eval mode with requires_grad=False params, gradients still flow.
        layer.weight.requires_grad_(False)
        layer.bias.requires_grad_(False)
        x_eval.requires_grad_()
        layer(x_eval).sum().backward()
        out["frozen_grad_ok"] = bool(torch.isfinite(x_eval.grad).all())
    ring.close()
    return out


def conv_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 5 * 5, 3),
        nn.BatchNorm1d(3),
    )


def conv_data(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(n, 2, 5, 5, generator=g) * 2 + 1, torch.randint(0, 3, (n,), generator=g)


def train_conv(sync: bool, steps: int = 3) -> dict:
    """SGD through ring.setup (real DDP on 2 ranks, 4 rows each; one process: all 8 rows)."""
    ring = rt.Ring(seed=0)
    model = conv_model()
    if sync:
        model = convert_sync_batchnorm(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = ring.setup(model, optimizer)
    x, y = conv_data()
    b = len(x) // ring.world_size
    x, y = x[ring.rank * b : (ring.rank + 1) * b], y[ring.rank * b : (ring.rank + 1) * b]
    for _ in range(steps):
        ring.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    state = {k: v.detach().clone() for k, v in ring.strategy.unwrap(model).state_dict().items()}
    ring.close()
    return state
