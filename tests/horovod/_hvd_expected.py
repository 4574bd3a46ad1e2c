"""Inputs the multi-process jobs use, and the values they must produce, computed independently.

Both the ranks (to build their inputs) and the test process (to build the expected
results from every rank's input) call ``value``; the expected results use plain
torch arithmetic in int64/float64 on one process, never the code under test.
"""

from __future__ import annotations

import zlib

import torch

DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool)
OPS = ("Sum", "Average", "Min", "Max", "Product")


def value(rank: int, dtype: torch.dtype, shape, salt: str = "") -> torch.Tensor:
    """Small integers (exact in every dtype, products of 4 still fit int8), seeded by rank and case."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{rank}/{dtype}/{tuple(shape)}/{salt}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=g).bool()
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, tuple(shape), generator=g).to(dtype)


def reduce(inputs: list[torch.Tensor], op: str, pre: float = 1.0, post: float = 1.0) -> torch.Tensor:
    dtype, n = inputs[0].dtype, len(inputs)
    if dtype == torch.bool:
        stack = torch.stack(inputs)
        return stack.any(0) if op in ("Sum", "Max") else stack.all(0)
    floating = dtype.is_floating_point
    stack = torch.stack([t.double() if floating else t.long() for t in inputs])
    if pre != 1.0:
        stack = stack * pre if floating else (stack.double() * pre).trunc().long()
    if op in ("Sum", "Average"):
        out = stack.sum(0)
    elif op == "Min":
        out = stack.min(0).values
    elif op == "Max":
        out = stack.max(0).values
    else:
        out = stack.prod(0)
    if op == "Average":
        out = out / n if floating else torch.div(out, n, rounding_mode="trunc")
    if post != 1.0:
        out = out * post if floating else (out.double() * post).trunc().long()
    if dtype in (torch.uint8, torch.int8, torch.int16, torch.int32):
        return out.to(torch.int64).to(dtype)  # wraps like the dtype's own arithmetic
    return out.to(dtype)


def reducescatter_rows(rows: int, n: int) -> list[int]:
    return [rows // n + (1 if r < rows % n else 0) for r in range(n)]


def reducescatter(inputs: list[torch.Tensor], op: str, rank: int) -> torch.Tensor:
    full = reduce(inputs, op)
    counts = reducescatter_rows(full.shape[0], len(inputs))
    start = sum(counts[:rank])
    return full[start:start + counts[rank]]


def alltoall(inputs: list[torch.Tensor], splits: list[list[int]], rank: int) -> tuple[torch.Tensor, list[int]]:
    """What ``rank`` receives: from each sender j, the block j addressed to ``rank``."""
    pieces, received = [], []
    for j, t in enumerate(inputs):
        start = sum(splits[j][:rank])
        pieces.append(t[start:start + splits[j][rank]])
        received.append(splits[j][rank])
    return torch.cat(pieces), received


def a2a_splits(rank: int, n: int) -> list[int]:
    """Uneven splits: rank r sends (r + j) % 3 rows to rank j."""
    return [(rank + j) % 3 for j in range(n)]


# --- training: a small model, fixed data, and the single-process reference ----------------
def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.ModuleDict({
        "fc1": torch.nn.Linear(10, 16), "fc2": torch.nn.Linear(16, 3),
        "unused": torch.nn.Linear(2, 2),  # never in forward: its grad must stay None
    })
    return model


def forward(model, x):
    return model["fc2"](torch.relu(model["fc1"](x)))


def data():
    g = torch.Generator().manual_seed(7)
    return torch.randn(256, 10, generator=g), torch.randint(0, 3, (256,), generator=g)


PER_RANK = 4


def shard(step: int, micro: int, rank: int, n: int, k: int):
    """Rank ``rank``'s micro-batch ``micro`` of global step ``step`` (k micro-batches per step)."""
    x, y = data()
    size = n * PER_RANK * k
    start = step * size + (micro * n + rank) * PER_RANK
    return x[start:start + PER_RANK], y[start:start + PER_RANK]


def block(step: int, n: int, k: int):
    x, y = data()
    size = n * PER_RANK * k
    return x[step * size:(step + 1) * size], y[step * size:(step + 1) * size]


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def reference(optimizer_factory, n: int, steps: int, k: int = 1, loss_scale: float = 1.0, clip=None,
              extra_rank0_steps: int = 0, horovod_init: bool = True):
    """One process, the combined batch of all ranks each step.

    ``horovod_init``: first what Horovod's ``broadcast_optimizer_state`` does to a fresh
    optimizer — zero gradients and one step (Adam then counts that step) — as
    ``hvd.broadcast_optimizer_state`` must; the ``hvd`` strategy does not.
    """
    import torch.nn.functional as F

    model = make_model(100)
    optimizer = optimizer_factory(model.parameters())
    if horovod_init:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
    for step in range(steps + extra_rank0_steps):
        if step < steps:
            x, y = block(step, n, k)
            (F.cross_entropy(forward(model, x), y) * loss_scale).backward()
        else:  # rank 0 alone (the others joined): its gradient averaged with zeros
            x, y = shard(step, 0, 0, n, k)
            (F.cross_entropy(forward(model, x), y) / n).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()
    assert model["unused"].weight.grad is None
    return flat(model)


def adasum_reference(n: int, steps: int, lr: float):
    """Horovod's delta optimizer by hand: each rank's plain-SGD change, combined with Adasum per tensor."""
    import torch.nn.functional as F

    from ringtrain.comm import adasum_combine

    model = make_model(100)
    for step in range(steps):
        deltas = []
        for rank in range(n):
            model.zero_grad()
            x, y = shard(step, 0, rank, n, 1)
            F.cross_entropy(forward(model, x), y).backward()
            deltas.append([-lr * p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()])
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p += adasum_combine([d[i].reshape(-1) for d in deltas], [p.numel()]).view_as(p)
    return flat(model)
