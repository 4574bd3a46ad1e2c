"""What ``ring.log`` costs a training loop: the same DDP loop logging every 10 steps, and not logging.

    python benchmarks/log_cost.py                  # 2 Gloo ranks, the mlp workload (quick size), 9 rounds each

The workload is ``mlp`` of ringtrain/bench/workloads.py (MLP 256-1024x3-10 on synthetic vectors,
communication-bound: the cheapest step, so the largest relative cost). Rounds alternate in the same
processes: one calling ``ring.log({"loss": loss, "lr": lr})`` after every 10th optimizer step (into a
run folder: metrics.csv, ranks.csv and TensorBoard's event file when tensorboard is installed), one
not. The ratio reported is the median over rounds of samples/s on/off. Target (issue 22): <= 1 %.

Rounds on a shared 2-core machine differ by more than 1 %, so the script also measures the cost
directly: the wall time spent inside ``ring.log`` (its collective, waiting for the other rank
included, and rank 0's writes), per call and per step, against the step time.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

import ringtrain as rt
from ringtrain.bench import workloads

EVERY = 10


def rounds(n: int, epochs: int, folder: str) -> dict:
    torch.set_num_threads(1)
    work = workloads.build("mlp", quick=True)
    ring = rt.Ring(seed=0, device="cpu", log_dir=folder)
    model = work.make_model()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=work.lr, momentum=0.9))
    loader = ring.loader(work.train, batch_size=work.global_batch // ring.world_size, shuffle=True)
    inside = [0.0, 0]  # seconds in ring.log, calls

    def timed(log: bool) -> float:
        ring.barrier()
        start = time.perf_counter()
        for _ in range(epochs):
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)
                ring.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                if log and ring.optimizer_steps % EVERY == 0:
                    began = time.perf_counter()
                    ring.log({"loss": loss, "lr": optimizer.param_groups[0]["lr"]})
                    inside[0] += time.perf_counter() - began
                    inside[1] += 1
        ring.barrier()
        return epochs * len(loader.sampler) * ring.world_size / (time.perf_counter() - start)

    timed(True)  # warm-up; opens the run folder's files
    inside[:] = [0.0, 0]
    out = []
    for i in range(n):
        results = {}
        for state in (("on", "off") if i % 2 == 0 else ("off", "on")):
            results[state] = timed(state == "on")
        out.append((results["off"], results["on"]))
    ring.close()
    step_s = ring.world_size * len(loader.sampler) / statistics.median(off for off, _ in out) / len(loader)
    return {"rounds": out, "step_s": step_s, "per_call_s": inside[0] / max(inside[1], 1), "calls": inside[1],
            "steps": len(loader) * epochs, "model": work.model_name}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        measured = rt.launch(rounds, 2, args=(args.rounds, args.epochs, folder))[0]
    results = measured["rounds"]
    ratios = [on / off for off, on in results]
    step, call = measured["step_s"], measured["per_call_s"]
    print(f"mlp ({measured['model']}, 2 Gloo ranks, {measured['steps']} steps a round, ring.log every {EVERY}): "
          f"off {statistics.median(o for o, _ in results):.0f} samples/s, on {statistics.median(n for _, n in results):.0f} "
          f"samples/s, on/off median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}, "
          f"{args.rounds} rounds)")
    print(f"measured directly: a step takes {step * 1e3:.2f} ms; a ring.log call {call * 1e3:.3f} ms "
          f"({measured['calls']} calls on rank 0), {call / EVERY * 1e3:.3f} ms per step: "
          f"{100 * call / EVERY / step:.2f} % of a step")


if __name__ == "__main__":
    main()
