"""Gradient accumulation with and without no_sync, and bf16 vs fp32 on CPU.

    python benchmarks/accumulation.py              # 2 Gloo ranks, ~6M-parameter MLP, 5 pairs

1. accumulate=4 through ringtrain (DDP all-reduces once per 4 micro-batches)
   against the same accumulation written without ``no_sync`` (the loss divided
   by 4, DDP all-reducing after every micro-batch) — the loop many tutorials
   show. Both count DDP all-reduce calls with a communication hook. Runs
   alternate inside the same two processes; the ratio is the median over pairs.
2. Mixed precision on CPU: samples/s of one process for precision 32 vs
   bf16-mixed on the same MLP (CPU autocast; it may well be slower than fp32 on
   CPUs without native bf16 units — reported as measured).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.utils.data import TensorDataset

import ringtrain as rt
from ringtrain.bench.models import MLP

ACCUMULATE = 4
MICRO_BATCH = 16


def data(n: int = 1024) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 1024, generator=g), torch.randint(0, 10, (n,), generator=g))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return MLP(inputs=1024, hidden=1800, layers=2, outputs=10)  # ~5.1M parameters


def run(no_sync: bool, epochs: int) -> tuple[float, int, int]:
    """samples/s over all ranks, all-reduce calls and optimizer steps in the timed epochs."""
    ring = rt.Ring(seed=0, accumulate=ACCUMULATE if no_sync else 1)
    net = model()
    net, optimizer = ring.setup(net, torch.optim.SGD(net.parameters(), lr=0.01))
    calls = [0]

    def counting(state, bucket):
        calls[0] += 1
        return allreduce_hook(state, bucket)

    net.register_comm_hook(None, counting)
    loader = ring.loader(data(), batch_size=MICRO_BATCH, shuffle=True)
    start, steps = 0.0, 0
    for epoch in ring.epochs(epochs + 1):
        if epoch == 1:
            ring.barrier()
            start, calls[0], steps = time.perf_counter(), 0, 0
        for i, (x, y) in enumerate(loader):
            loss = F.cross_entropy(net(x), y)
            if no_sync:
                ring.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                steps += int(ring.sync_now)
            else:  # the tutorial loop without no_sync: every backward all-reduces
                ring.backward(loss / ACCUMULATE)
                if (i + 1) % ACCUMULATE == 0:
                    optimizer.step()
                    optimizer.zero_grad()
                    steps += 1
    ring.barrier()
    elapsed = time.perf_counter() - start
    return epochs * len(loader) * MICRO_BATCH * ring.world_size / elapsed, calls[0], steps


def pairs(n_pairs: int, epochs: int) -> list[tuple]:
    torch.set_num_threads(1)
    out = []
    for i in range(n_pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        result = {flag: run(flag, epochs) for flag in order}
        out.append((result[True], result[False]))
    return out


def precision_throughput(precision: str, steps: int = 30) -> float:
    ring = rt.Ring(precision=precision)
    net = model()
    net, optimizer = ring.setup(net, torch.optim.SGD(net.parameters(), lr=0.01))
    x, y = data(64).tensors
    for i in range(steps + 5):
        if i == 5:
            start = time.perf_counter()
        ring.backward(F.cross_entropy(net(x), y))
        optimizer.step()
        optimizer.zero_grad()
    return steps * len(x) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    params = sum(p.numel() for p in model().parameters())
    print(f"torch {torch.__version__}, 2 Gloo ranks, {os.cpu_count()} cores, MLP {params / 1e6:.1f}M parameters, "
          f"micro-batch {MICRO_BATCH}, accumulate {ACCUMULATE}, {args.pairs} pairs")
    results = rt.launch(pairs, 2, args=(args.pairs, args.epochs), timeout=1800)[0]
    with_sync = [r[0] for r in results]
    without = [r[1] for r in results]
    ratios = [a[0] / b[0] for a, b in zip(with_sync, without)]
    print(f"{'mode':<34} {'samples/s (median)':>18} {'all-reduce calls':>17} {'optimizer steps':>16}")
    for name, rows in (("accumulate=4 with no_sync (ringtrain)", with_sync), ("accumulate=4 without no_sync", without)):
        print(f"{name:<34} {statistics.median(r[0] for r in rows):>18.0f} {rows[0][1]:>17} {rows[0][2]:>16}")
    print(f"speed-up with no_sync: median {statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f})")
    torch.set_num_threads(2)
    for precision in ("32", "bf16-mixed"):
        print(f"1 process, precision {precision:<10}: {precision_throughput(precision):.0f} samples/s")


if __name__ == "__main__":
    main()
