"""Pipeline parallelism on CPU/Gloo: parameter memory per rank, and the pipeline bubble.

    python benchmarks/pipeline.py                 # 2 stages on 2 processes, M = 2, 4, 8
    python benchmarks/pipeline.py --stages 4      # needs >= 4 free cores to mean anything

Model: an MLP of ``--layers`` x (Linear(H, H) + ReLU) blocks and a Linear(H, 10)
head, an nn.Sequential cut into S stages of equal depth (the head rides with the
last stage). Every rank runs one thread (``torch.set_num_threads(1)``), so the
S ranks are S CPU cores working side by side like S GPUs.

Memory: each rank counts the bytes of the parameters it holds on its device
after ``wrap_module`` (the other stages' tensors were moved to the meta device)
and compares them with the whole model's: ideally 1/S.

Bubble: with a fixed micro-batch size, a step of M micro-batches keeps each
stage busy for M x t, where t is one micro-batch's forward + backward on that
stage; theory for GPipe and 1F1B gives a step time T = (M+S-1) t, so a stage is
idle for the fraction (S-1)/(M+S-1) (Huang et al. 2019; Narayanan et al. 2021 —
both schedules have the same bubble, 1F1B only holds fewer activations). T is
the fastest of ``--rounds`` x ``--steps`` timed ``pipeline_step`` calls (after
warm-up steps that also build torch's stage buffers; rounds visit all
configurations in turn); the fastest, not the median, because on a shared
machine other processes only ever add time. t is measured on each rank by
timing its own stage's forward + backward of one micro-batch with no
communication (fastest of 10 per round, over all rounds); the slowest stage
sets the pace. Measured
bubble = 1 - M t / T, which also counts communication and Python overhead as
bubble, so it sits a little above theory on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import ringtrain as rt
from ringtrain.parallel import environments
from ringtrain.strategies import Pipeline


def make_model(width: int, layers: int) -> nn.Sequential:
    torch.manual_seed(0)
    blocks = [m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())]
    return nn.Sequential(*blocks, nn.Linear(width, 10))


def split_points(stages: int, layers: int) -> list[str]:
    per = layers // stages
    return [str(2 * per * s) for s in range(1, stages)]  # module index of the first Linear of each stage


def param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.device.type != "meta")


def stage_alone(stage: nn.Module, x: torch.Tensor, last: bool, reps: int) -> float:
    """Fastest seconds of one micro-batch's forward + backward through this stage, without communication."""
    y = torch.zeros(x.shape[0], dtype=torch.long)
    times = []
    for i in range(reps + 2):
        start = time.perf_counter()
        out = stage(x.requires_grad_(True))
        (F.cross_entropy(out, y) if last else out).backward(None if last else torch.ones_like(out))
        if i >= 2:
            times.append(time.perf_counter() - start)
    stage.zero_grad()
    return min(times)


def bench(stages: int, width: int, layers: int, micro: int, steps: int, rounds: int, schedules: list[str]) -> list[dict]:
    torch.set_num_threads(1)
    runs: list[dict] = []
    for schedule in schedules:
        for m in (stages, 2 * stages, 4 * stages):
            strategy = Pipeline(stages=stages, microbatches=m, schedule=schedule).attach(environments.detect(), device="cpu")
            strategy.setup_environment()  # the first one forms the process group; later ones only add subgroups
            model = make_model(width, layers)
            whole = param_bytes(model)
            stage = strategy.wrap_module(model, split_at=split_points(stages, layers))
            g = torch.Generator().manual_seed(0)
            batch = (torch.randn(m * micro, width, generator=g), torch.randint(0, 10, (m * micro,), generator=g))
            runs.append({"schedule": schedule, "M": m, "rank": strategy.rank, "local": param_bytes(stage), "whole": whole,
                             "stage": stage, "times": [], "strategy": strategy, "optimizer": torch.optim.SGD(stage.parameters(), lr=1e-3),
                             "batch": batch})
    # Rounds visit every configuration in turn, so a burst of load elsewhere hits all of them alike.
    # t is one quantity for all configurations (same stage, same micro-batch size): timed every round.
    alone = []
    for r in range(rounds):
        alone.append(stage_alone(runs[0]["stage"], torch.randn(micro, width), runs[0]["strategy"].is_last_stage, reps=10))
        for run in runs:
            for i in range(steps + (2 if r == 0 else 0)):
                dist.barrier()
                start = time.perf_counter()
                run["strategy"].pipeline_step(*run["batch"], F.cross_entropy)
                if r or i >= 2:  # the first steps build torch's stage buffers (shape inference)
                    run["times"].append(time.perf_counter() - start)
                run["optimizer"].step()
                run["optimizer"].zero_grad()
    t = torch.tensor(min(alone))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest stage sets the pace
    rows = []
    for run in runs:
        step = torch.tensor(min(run["times"]))
        dist.all_reduce(step, op=dist.ReduceOp.MAX)
        rows.append({k: run[k] for k in ("schedule", "M", "rank", "local", "whole")} | {"step": step.item(), "t": t.item()})
    runs[0]["strategy"].teardown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8, help="Linear+ReLU blocks in all (a multiple of --stages)")
    parser.add_argument("--micro-batch", type=int, default=32, help="rows per micro-batch")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per configuration per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--schedules", default="gpipe,1f1b")
    args = parser.parse_args()
    s = args.stages
    load = os.getloadavg()[0]  # before we start: others' processes inflate the bubble, so say how busy it was
    results = rt.launch(bench, s, args=(s, args.width, args.layers, args.micro_batch, args.steps,
                                        args.rounds, args.schedules.split(",")), timeout=1800)
    whole = results[0][0]["whole"]
    print(f"torch {torch.__version__}, {s} Gloo ranks x 1 thread, {os.cpu_count()} cores (load {load:.1f}); MLP {args.layers}x{args.width} "
          f"+ head = {whole / 4 / 1e6:.1f}M parameters, micro-batch {args.micro_batch} rows")
    print(f"parameter memory per rank (MiB): whole model {whole / 2**20:.1f}; " + ", ".join(
        f"rank {r[0]['rank']} {r[0]['local'] / 2**20:.1f} ({r[0]['local'] / whole:.2f} of it)" for r in results))
    print(f"{'schedule':<9} {'M':>3} {'t ms':>6} {'step T ms':>10} {'M*t ms':>7} {'bubble 1-Mt/T':>14} {'(S-1)/(M+S-1)':>14}")
    for row in results[0]:
        ideal = row["M"] * row["t"]
        print(f"{row['schedule']:<9} {row['M']:>3} {row['t'] * 1e3:>6.1f} {row['step'] * 1e3:>10.1f} {ideal * 1e3:>7.1f} "
              f"{1 - ideal / row['step']:>14.3f} {(s - 1) / (row['M'] + s - 1):>14.3f}")


if __name__ == "__main__":
    main()
