"""What ``ring.log`` costs a training loop: the same DDP loop logging every 10 steps, and not logging.

    python benchmarks/log_cost.py                  # 2 Gloo ranks, the mlp workload (quick size), 9 rounds each

The workload is ``mlp`` of ringtrain/bench/workloads.py (MLP 256-1024x3-10 on synthetic vectors,
communication-bound: the cheapest step, so the largest relative cost). Rounds alternate in the same
processes: one calling ``ring.log({"loss": loss, "lr": lr})`` after every 10th optimizer step (into a
run folder: metrics.csv, ranks.csv and TensorBoard's event file when tensorboard is installed), one
not. The ratio reported is the median over rounds of samples/s on/off. Target (issue 22): <= 1 %.

Rounds on a shared 2-core machine differ by more than 1 %, so the script also measures the cost
directly: the wall time spent inside ``ring.log`` per call and per step, against the step time, split
into its one collective (waiting for the other rank included: time the next gradient all-reduce would
otherwise have waited) and ringtrain's own work (packing the values, reducing the matrix, rank 0's
metrics.csv / ranks.csv / TensorBoard writes); and once more with the ranks lined up by a barrier
before each call (``--aligned`` calls, outside the rounds), which leaves the call's own latency: what
logging adds when no rank is behind.
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


def rounds(n: int, epochs: int, folder: str, calls: int) -> dict:
    torch.set_num_threads(1)
    work = workloads.build("mlp", quick=True)
    ring = rt.Ring(seed=0, device="cpu", log_dir=folder)
    model = work.make_model()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=work.lr, momentum=0.9))
    loader = ring.loader(work.train, batch_size=work.global_batch // ring.world_size, shuffle=True)
    inside = [0.0, 0]  # seconds in ring.log, calls
    collective = [0.0]  # of which in the call's all_reduce
    all_reduce = ring.strategy.all_reduce

    def timed_all_reduce(x, op="mean"):  # the strategy's own, timed (only ring.log calls it in this loop)
        began = time.perf_counter()
        try:
            return all_reduce(x, op)
        finally:
            collective[0] += time.perf_counter() - began

    ring.strategy.all_reduce = timed_all_reduce

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
    inside[:], collective[0] = [0.0, 0], 0.0
    out = []
    for i in range(n):
        results = {}
        for state in (("on", "off") if i % 2 == 0 else ("off", "on")):
            results[state] = timed(state == "on")
        out.append((results["off"], results["on"]))
    in_rounds = collective[0]  # the aligned calls below go through the same all_reduce
    aligned = []
    for i in range(calls):  # the call alone: both ranks arrive together
        ring.barrier()
        began = time.perf_counter()
        ring.log({"loss": torch.tensor(0.5), "lr": 0.1}, step=10**6 + i)
        aligned.append(time.perf_counter() - began)
    ring.close()
    step_s = ring.world_size * len(loader.sampler) / statistics.median(off for off, _ in out) / len(loader)
    return {"rounds": out, "step_s": step_s, "per_call_s": inside[0] / max(inside[1], 1), "calls": inside[1],
            "collective_s": in_rounds / max(inside[1], 1), "aligned_s": statistics.median(aligned),
            "steps": len(loader) * epochs, "model": work.model_name}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--aligned", type=int, default=200, help="calls timed with the ranks lined up")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        measured = rt.launch(rounds, 2, args=(args.rounds, args.epochs, folder, args.aligned))[0]
    results = measured["rounds"]
    aligned = measured["aligned_s"]
    ratios = [on / off for off, on in results]
    step, call = measured["step_s"], measured["per_call_s"]
    print(f"mlp ({measured['model']}, 2 Gloo ranks, {measured['steps']} steps a round, ring.log every {EVERY}): "
          f"off {statistics.median(o for o, _ in results):.0f} samples/s, on {statistics.median(n for _, n in results):.0f} "
          f"samples/s, on/off median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}, "
          f"{args.rounds} rounds)")
    print(f"measured directly: a step takes {step * 1e3:.2f} ms; a ring.log call {call * 1e3:.3f} ms "
          f"({measured['calls']} calls on rank 0), {call / EVERY * 1e3:.3f} ms per step: "
          f"{100 * call / EVERY / step:.2f} % of a step; of which the collective {measured['collective_s'] * 1e3:.3f} ms "
          f"({100 * measured['collective_s'] / EVERY / step:.2f} %), ringtrain's own work "
          f"{(call - measured['collective_s']) * 1e3:.3f} ms ({100 * (call - measured['collective_s']) / EVERY / step:.2f} %)")
    print(f"with the ranks lined up (median of {args.aligned} calls): a ring.log call {aligned * 1e3:.3f} ms, "
          f"{aligned / EVERY * 1e3:.3f} ms per step: {100 * aligned / EVERY / step:.2f} % of a step")


if __name__ == "__main__":
    main()
