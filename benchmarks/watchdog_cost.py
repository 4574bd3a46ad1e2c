"""What the fail-fast watchdog costs a training loop: the same DDP loop with it running and halted.

    python benchmarks/watchdog_cost.py                 # 2 Gloo ranks, the MLP of overhead.py, 9 rounds each

The ring forms its own process group (so its liveness board and watchdog run, unlike in
overhead.py, where the hand-written loop forms the group first and the ring adopts it). Rounds
alternate in the same processes: one with a watchdog polling the board every 0.5 s (what every
ring does), one with it halted. The figure is samples/s over all ranks; the ratio reported is
the median over rounds of on/off. Target (issue 10): nothing here may slow the loop (>= 0.98);
issue 19: progress and stall inspection within 1 %.

Rounds on a shared 2-core machine differ by more than 1 %, so the script also measures the two
costs directly, which the rounds cannot resolve: the CPU time the watchdog's thread used (per
second of the run, and per step), and the counter bumps the loop does each step (a fresh
Activity, the same calls a ring step makes, timed over many steps) — both against the step time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ringtrain as rt  # noqa: E402
from overhead import WORKLOADS, dataset, ring_samples_per_s  # noqa: E402
from ringtrain.liveness import membership as liveness  # noqa: E402
from ringtrain.liveness.activity import Activity  # noqa: E402


class TimedWatchdog(liveness.Watchdog):
    """The ring's watchdog, which also counts the CPU time its thread uses."""

    cpu = 0.0

    def run(self) -> None:
        start = time.thread_time()
        try:
            super().run()
        finally:
            self.cpu = time.thread_time() - start


def bumps_per_step(steps: int = 200_000) -> float:
    """Seconds per step of what a ring's loop adds to a step: the loader's step mark and data phase,
    backward's and the optimizer's timed phases, the step counter."""
    activity = Activity()
    start = time.perf_counter()
    for i in range(steps):
        activity.times.step_begins(time.perf_counter())
        with activity.timed("data", "data"):
            pass
        activity.enter("forward")
        with activity.timed("backward", "sync"):
            pass
        with activity.timed("optimizer", "sync"):
            pass
        activity.step = i
    return (time.perf_counter() - start) / steps


def rounds(workload: str, n: int, epochs: int) -> list[tuple[float, float]]:
    torch.set_num_threads(1)
    make, shape, samples, batch = WORKLOADS[workload]
    ring = rt.Ring(seed=0, device="cpu")
    model = make()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    loader = ring.loader(dataset(shape, samples), batch_size=batch, shuffle=True)
    membership = ring.strategy.group.membership
    membership.watchdog.halt()  # the ring's own: each "on" round starts one of the same kind

    steps_per_round = epochs * len(loader)
    watchdog_cpu = watchdog_wall = 0.0

    def timed() -> float:
        return ring_samples_per_s(ring, model, optimizer, loader, epochs)

    timed()  # warm-up
    out = []
    for i in range(n):
        results = {}
        for state in (("on", "off") if i % 2 == 0 else ("off", "on")):
            if state == "on":
                dog = TimedWatchdog(membership.board, backward_syncs=True, error_file=None)
                dog.start()
                began = time.perf_counter()
                results["on"] = timed()
                dog.halt()
                dog.join()
                watchdog_wall += time.perf_counter() - began
                watchdog_cpu += dog.cpu
            else:
                results["off"] = timed()
        out.append((results["off"], results["on"]))
    ring.close()
    step_s = ring.world_size * len(loader.sampler) / statistics.median(off for off, _ in out) / len(loader)
    return {"rounds": out, "step_s": step_s, "watchdog_cpu_per_s": watchdog_cpu / watchdog_wall,
            "watchdog_cpu_per_step": watchdog_cpu / (n * steps_per_round), "bumps_per_step": bumps_per_step()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workload", default="mlp", choices=sorted(WORKLOADS))
    args = parser.parse_args()
    measured = rt.launch(rounds, 2, args=(args.workload, args.rounds, args.epochs))[0]
    results = measured["rounds"]
    ratios = [on / off for off, on in results]
    print(f"{args.workload}: off {statistics.median(o for o, _ in results):.0f} samples/s, "
          f"on {statistics.median(n for _, n in results):.0f} samples/s, "
          f"on/off median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}, "
          f"{args.rounds} rounds)")
    step = measured["step_s"]
    print(f"measured directly: a step takes {step * 1e3:.2f} ms; the watchdog's thread used "
          f"{measured['watchdog_cpu_per_s'] * 1e3:.2f} ms of CPU per second "
          f"({measured['watchdog_cpu_per_step'] * 1e6:.1f} us per step, "
          f"{100 * measured['watchdog_cpu_per_step'] / step:.3f} % of a step); the loop's counter bumps "
          f"{measured['bumps_per_step'] * 1e6:.2f} us per step ({100 * measured['bumps_per_step'] / step:.3f} % of a step); "
          f"together {100 * (measured['watchdog_cpu_per_step'] + measured['bumps_per_step']) / step:.3f} %")


if __name__ == "__main__":
    main()
