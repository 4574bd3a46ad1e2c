"""ringtrain's loop against the hand-written DDP loop the tutorials teach: same model, same data.

    python benchmarks/overhead.py                 # 2 Gloo ranks on CPU, small CNN and MLP, 5 pairs
    python benchmarks/overhead.py --pairs 7 --epochs 3

Both loops run inside the same two processes, alternating (raw first on even
pairs, ringtrain first on odd ones) so drift in machine load hits both alike.
Each measurement is one warm-up epoch (excluded) then ``--epochs`` timed epochs
between barriers; the figure is samples/s over all ranks. The ratio reported is
the median over pairs of ringtrain/raw. Target (issue 2): >= 0.98.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ringtrain as rt  # noqa: E402
from ringtrain.bench.models import MLP, DigitsCNN  # noqa: E402

WORKLOADS = {
    # name: (model factory, input shape, samples, batch per rank)
    "cnn": (lambda: DigitsCNN(width=32), (1, 8, 8), 2048, 32),
    "mlp": (lambda: MLP(inputs=64, hidden=512, layers=3), (64,), 4096, 64),
}



def ring_samples_per_s(ring, model, optimizer, loader, epochs: int) -> float:
    """Samples/s over all ranks of ``epochs`` of the ring loop (barriers around the timed part)."""
    ring.barrier()
    start = time.perf_counter()
    for _ in range(epochs):
        for x, y in loader:
            ring.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    ring.barrier()
    return epochs * len(loader.sampler) * ring.world_size / (time.perf_counter() - start)

def dataset(shape, n):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g))


def raw_ddp(workload: str, epochs: int) -> float:
    """The tutorial loop: init_process_group + DistributedSampler + set_epoch + DDP."""
    make, shape, n, batch = WORKLOADS[workload]
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(make())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sampler = DistributedSampler(dataset(shape, n), num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(sampler.dataset, batch_size=batch, sampler=sampler)
    start = 0.0
    for epoch in range(epochs + 1):
        if epoch == 1:  # epoch 0 is the warm-up
            dist.barrier()
            start = time.perf_counter()
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
    dist.barrier()
    return epochs * len(sampler) * world / (time.perf_counter() - start)


def ringtrain_loop(workload: str, epochs: int) -> float:
    """The same training through ringtrain: Ring + setup + loader + epochs + backward."""
    make, shape, n, batch = WORKLOADS[workload]
    ring = rt.Ring(seed=0)
    model = make()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = ring.setup(model, optimizer)
    loader = ring.loader(dataset(shape, n), batch_size=batch, shuffle=True)
    start = 0.0
    for epoch in ring.epochs(epochs + 1):
        if epoch == 1:
            ring.barrier()
            start = time.perf_counter()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            ring.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    ring.barrier()
    return epochs * len(loader.sampler) * ring.world_size / (time.perf_counter() - start)


def pairs(workload: str, n_pairs: int, epochs: int) -> list[tuple[float, float]]:
    torch.set_num_threads(1)  # 2 ranks on 2 cores: one thread each, like torchrun's default
    out = []
    for i in range(n_pairs):
        if i % 2 == 0:
            raw = raw_ddp(workload, epochs)
            ours = ringtrain_loop(workload, epochs)
        else:
            ours = ringtrain_loop(workload, epochs)
            raw = raw_ddp(workload, epochs)
        out.append((raw, ours))
    dist.destroy_process_group()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--workloads", default="cnn,mlp")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {args.nprocs} Gloo ranks on CPU, {os.cpu_count()} cores, {args.pairs} pairs")
    print(f"{'workload':<8} {'raw-ddp samples/s':>18} {'ringtrain samples/s':>20} {'ratio (median)':>15} {'ratio range':>15}")
    for workload in args.workloads.split(","):
        results = rt.launch(pairs, args.nprocs, args=(workload, args.pairs, args.epochs), timeout=1800)[0]
        ratios = [ours / raw for raw, ours in results]
        raw_med = statistics.median(r for r, _ in results)
        ours_med = statistics.median(o for _, o in results)
        print(
            f"{workload:<8} {raw_med:>18.0f} {ours_med:>20.0f} {statistics.median(ratios):>15.3f} "
            f"{min(ratios):>7.3f}-{max(ratios):.3f}"
        )


if __name__ == "__main__":
    main()
