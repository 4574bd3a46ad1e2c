"""Horovod-style DistributedOptimizer (ringtrain.horovod) against DDP on the same model, and tensor fusion.

    python benchmarks/hvd_vs_ddp.py                      # 2 Gloo ranks on CPU, 15 rounds
    python benchmarks/hvd_vs_ddp.py --rounds 25 --steps 10

Part 1 — throughput: the same model, data and SGD loop, once wrapped in torch's
DistributedDataParallel and once with ``hvd.DistributedOptimizer`` (gradient hooks,
fusion buckets, async allreduce; defaults: 64 MiB buckets, cross-rank checks on),
and once more with the checks off (RINGTRAIN_HVD_CHECKS=0), whose per-step descriptor
exchange is one more small collective. Target (issue 4): hvd >= 0.95 x DDP.

Part 2 — fusion: a model of 100 small Linear layers (200 parameter tensors), with
HOROVOD_FUSION_THRESHOLD at its 64 MiB default (one bucket, one allreduce per step)
and at 0 (one allreduce per tensor).

All contestants are built once and then take turns inside the same processes: a
round times ``--steps`` steps of each (which one starts rotates every round), after
warm-up steps. Short alternating segments keep the comparison fair on
a shared machine whose load drifts. Reported: samples/s over all ranks (median over
rounds) and the median of the per-round ratios, with its range; and DDP raced against
itself, the noise floor — a ratio within that floor's spread of 1 says nothing.

On a machine that others load too, wall-clock ratios drift with their load; the CPU time
the job's processes spend per step (every thread: compute, hooks, Gloo's threads and
syscalls) moves much less, and an extra collective per step shows there as well. It is
printed as CPU ms per step (median over rounds) and its ratio to DDP's.
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
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ringtrain as rt  # noqa: E402
import ringtrain.horovod as hvd  # noqa: E402
from ringtrain.bench.models import MLP, DigitsCNN  # noqa: E402

WARMUP = 5


def small_layers(count: int = 100, width: int = 32) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, width),
                         *[m for _ in range(count - 2) for m in (nn.Linear(width, width), nn.ReLU())],
                         nn.Linear(width, 10))


WORKLOADS = {
    # name: (model factory, input shape, batch per rank)
    "mlp": (lambda: MLP(inputs=64, hidden=512, layers=3), (64,), 64),
    "cnn": (lambda: DigitsCNN(width=32), (1, 8, 8), 32),
    "small100": (small_layers, (64,), 32),
}


class Contestant:
    """A model, its optimizer and its data, stepped ``steps`` at a time."""

    def __init__(self, model, optimizer, shape, batch: int):
        g = torch.Generator().manual_seed(dist.get_rank())
        self.model, self.optimizer = model, optimizer
        self.data = [(torch.randn(batch, *shape, generator=g), torch.randint(0, 10, (batch,), generator=g))
                     for _ in range(8)]
        self.i = 0
        self.run(WARMUP)

    def run(self, steps: int) -> None:
        for _ in range(steps):
            x, y = self.data[self.i % len(self.data)]
            self.i += 1
            self.optimizer.zero_grad()
            F.cross_entropy(self.model(x), y).backward()
            self.optimizer.step()

    def timed(self, steps: int) -> tuple[float, float]:
        """(samples/s over all ranks, CPU ms per step summed over ranks)."""
        dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        self.run(steps)
        cpu = torch.tensor([time.process_time() - cpu])
        dist.barrier()
        wall = time.perf_counter() - start
        dist.all_reduce(cpu)
        return steps * len(self.data[0][0]) * dist.get_world_size() / wall, 1000 * cpu.item() / steps


def ddp(workload: str) -> Contestant:
    make, shape, batch = WORKLOADS[workload]
    torch.manual_seed(0)
    model = DDP(make())
    return Contestant(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), shape, batch)


def horovod(workload: str, fusion_threshold: int | None = None, checks: bool = True) -> Contestant:
    """``hvd.DistributedOptimizer``; HOROVOD_FUSION_THRESHOLD (None = default) is read at init, as in Horovod."""
    hvd.shutdown()
    if fusion_threshold is None:
        os.environ.pop("HOROVOD_FUSION_THRESHOLD", None)
    else:
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(fusion_threshold)
    hvd.init(checks=checks)
    make, shape, batch = WORKLOADS[workload]
    torch.manual_seed(0)
    model = make()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                         named_parameters=model.named_parameters())
    return Contestant(model, optimizer, shape, batch)


def race(contestants: list[Contestant], rounds: int, steps: int) -> list[list[tuple[float, float]]]:
    """Per round, every contestant's (samples/s, CPU ms/step); the starting contestant rotates every round."""
    out = []
    for i in range(rounds):
        row = [(0.0, 0.0)] * len(contestants)
        for k in range(len(contestants)):
            j = (i + k) % len(contestants)
            row[j] = contestants[j].timed(steps)
        out.append(row)
    return out


def job(workloads: list[str], rounds: int, steps: int) -> dict:
    torch.set_num_threads(1)  # 2 ranks on 2 cores: one thread each, like torchrun's default
    hvd.init()
    results = {}
    for workload in workloads:
        # DDP, DDP again (the noise floor: identical runs on this machine now), hvd, hvd without checks
        contestants = [ddp(workload), ddp(workload), horovod(workload), horovod(workload, checks=False)]
        results[workload] = race(contestants, rounds, steps)
    results["fusion"] = race([horovod("small100"), horovod("small100", fusion_threshold=0)], rounds, steps)
    hvd.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per contestant per round")
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--workloads", default="mlp,cnn,small100")
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    results = rt.launch(job, args.nprocs, args=(workloads, args.rounds, args.steps), timeout=3600)[0]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, {args.nprocs} Gloo ranks on CPU, {os.cpu_count()} cores "
          f"(load average {load:.1f}), {args.rounds} alternating rounds x {args.steps} steps")
    print("samples/s are medians over rounds; ratios are medians of per-round ratios to DDP (range).")
    print(f"{'workload':<9} {'DDP':>7} {'hvd':>7} {'hvd/DDP':>19} {'hvd, no checks/DDP':>21} {'DDP/DDP (noise)':>19}")
    for workload in workloads:
        rows = results[workload]

        def ratio(k: int, rows=rows) -> str:
            values = [row[k][0] / row[0][0] for row in rows]
            return f"{statistics.median(values):.3f} ({min(values):.2f}-{max(values):.2f})"

        print(f"{workload:<9} {statistics.median(r[0][0] for r in rows):>7.0f} "
              f"{statistics.median(r[2][0] for r in rows):>7.0f} {ratio(2):>19} {ratio(3):>21} {ratio(1):>19}")
    print("\nCPU ms per step, all ranks' processes (median over rounds); DDP's divided by each (>= 1: no costlier):")
    print(f"{'workload':<9} {'DDP':>7} {'DDP again':>10} {'hvd':>7} {'hvd, no checks':>15} {'DDP/hvd':>8} {'DDP/no checks':>14}")
    for workload in workloads:
        cpu = [statistics.median(r[k][1] for r in results[workload]) for k in range(4)]
        print(f"{workload:<9} {cpu[0]:>7.2f} {cpu[1]:>10.2f} {cpu[2]:>7.2f} {cpu[3]:>15.2f} {cpu[0] / cpu[2]:>8.3f} "
              f"{cpu[0] / cpu[3]:>14.3f}")
    rows = results["fusion"]
    ratios = [on[0] / off[0] for on, off in rows]
    print(f"\nfusion, 100 small layers (200 tensors): "
          f"on (64 MiB buckets) {statistics.median(on[0] for on, _ in rows):.0f} samples/s, "
          f"off (threshold 0) {statistics.median(off[0] for _, off in rows):.0f} samples/s, "
          f"on/off {statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
