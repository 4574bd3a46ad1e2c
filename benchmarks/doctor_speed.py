"""How long `ringtrain doctor` takes on a 1,000-line training script (target, issue 13: < 1 s).

    python benchmarks/doctor_speed.py                 # 1,000 lines, 7 repeats
    python benchmarks/doctor_speed.py --lines 5000 --repeats 3

The script is generated: a module of DDP training routines written the way the tutorials
write them (DistributedSampler, DataLoader, DDP, an epoch loop calling a train and an
evaluate function, all_reduce, a guarded save, argparse), each routine with its own
names, repeated until the file has the requested number of lines, plus one shared
``main`` that calls them all — so the call graph, the scopes and the name tables grow
with the file as they do in a real one. The timed part is ``check_source`` (parse, build
the indexes, run every rule), the median of the repeats; the time for ``ast.parse`` alone
is printed next to it. The command line adds Python's and the package's start-up on top.
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from ringtrain.doctor import check_source  # noqa: E402

HEADER = '''"""Generated for benchmarks/doctor_speed.py: many DDP routines in one module."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
'''

ROUTINE = '''

class Net{i}(nn.Module):
    def __init__(self, width={i}):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, width + 8), nn.ReLU(), nn.Linear(width + 8, 4))

    def forward(self, x):
        return self.body(x)


def train_epoch_{i}(model, loader, optimizer, accumulate):
    model.train()
    for step, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y) / accumulate
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return loss.detach()


def evaluate_{i}(model, loader):
    model.eval()
    counts = torch.zeros(2)
    with torch.no_grad():
        for x, y in loader:
            counts[0] += (model(x).argmax(1) == y).sum()
            counts[1] += len(y)
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def run_{i}(args, rank):
    train_set_{i} = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
    val_set_{i} = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    sampler_{i} = DistributedSampler(train_set_{i}, shuffle=True, seed=args.seed)
    loader_{i} = DataLoader(train_set_{i}, batch_size=args.batch_size // 2, sampler=sampler_{i})
    val_loader_{i} = DataLoader(val_set_{i}, batch_size=64)
    model_{i} = DDP(Net{i}())
    optimizer_{i} = torch.optim.SGD(model_{i}.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        sampler_{i}.set_epoch(epoch)
        last = train_epoch_{i}(model_{i}, loader_{i}, optimizer_{i}, 1)
        acc = evaluate_{i}(model_{i}, val_loader_{i})
        if rank == 0:
            print(f"routine {i} epoch {{epoch}} loss {{last.item():.4f}} acc {{acc:.3f}}")
            torch.save(model_{i}.module.state_dict(), os.path.join(args.out, "routine_{i}.pt"))
    return acc
'''

FOOTER = '''

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
{calls}

if __name__ == "__main__":
    main()
'''


def script(lines: int) -> str:
    parts, i = [HEADER], 0
    while sum(p.count("\n") for p in parts) + 15 + i < lines:
        parts.append(ROUTINE.format(i=i))
        i += 1
    calls = "\n".join(f"    run_{k}(args, rank)" for k in range(i))
    return "".join(parts) + FOOTER.format(calls=calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    source = script(args.lines)
    n_lines = source.count("\n")
    check_source(source, "generated.py")  # warm-up: imports, regex compilation
    parse_times, check_times, findings = [], [], None
    for _ in range(args.repeats):
        start = time.perf_counter()
        ast.parse(source)
        parse_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        findings = check_source(source, "generated.py")
        check_times.append(time.perf_counter() - start)
    print(f"{n_lines} lines, {len(findings)} findings (the generated script is correct: expect 0)")
    print(f"ast.parse alone: median {statistics.median(parse_times) * 1000:.1f} ms")
    print(f"check_source:    median {statistics.median(check_times) * 1000:.1f} ms "
          f"(min {min(check_times) * 1000:.1f}, max {max(check_times) * 1000:.1f}) over {args.repeats} runs")


if __name__ == "__main__":
    main()
