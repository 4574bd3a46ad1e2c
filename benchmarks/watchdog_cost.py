"""What the fail-fast watchdog costs a training loop: the same DDP loop with it running and halted.

    python benchmarks/watchdog_cost.py                 # 2 Gloo ranks, the MLP of overhead.py, 9 rounds each

The ring forms its own process group (so its liveness board and watchdog run, unlike in
overhead.py, where the hand-written loop forms the group first and the ring adopts it). Rounds
alternate in the same processes: one with a watchdog polling the board every 0.5 s (what every
ring does), one with it halted. The figure is samples/s over all ranks; the ratio reported is
the median over rounds of on/off. Target (issue 10): nothing here may slow the loop (>= 0.98).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ringtrain as rt  # noqa: E402
from overhead import WORKLOADS, dataset  # noqa: E402
from ringtrain import liveness  # noqa: E402


def rounds(workload: str, n: int, epochs: int) -> list[tuple[float, float]]:
    torch.set_num_threads(1)
    make, shape, samples, batch = WORKLOADS[workload]
    ring = rt.Ring(seed=0, device="cpu")
    model = make()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    loader = ring.loader(dataset(shape, samples), batch_size=batch, shuffle=True)
    membership = ring.strategy.group.membership
    membership.watchdog.halt()  # the ring's own: each "on" round starts one of the same kind

    def timed() -> float:
        ring.barrier()
        start = time.perf_counter()
        for _ in range(epochs):
            for x, y in loader:
                ring.backward(F.cross_entropy(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
        ring.barrier()
        return epochs * len(loader.sampler) * ring.world_size / (time.perf_counter() - start)

    timed()  # warm-up
    out = []
    for i in range(n):
        results = {}
        for state in (("on", "off") if i % 2 == 0 else ("off", "on")):
            if state == "on":
                dog = liveness.Watchdog(membership.board, backward_syncs=True, error_file=None)
                dog.start()
                results["on"] = timed()
                dog.halt()
                dog.join()
            else:
                results["off"] = timed()
        out.append((results["off"], results["on"]))
    ring.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workload", default="mlp", choices=sorted(WORKLOADS))
    args = parser.parse_args()
    results = rt.launch(rounds, 2, args=(args.workload, args.rounds, args.epochs))[0]
    ratios = [on / off for off, on in results]
    print(f"{args.workload}: off {statistics.median(o for o, _ in results):.0f} samples/s, "
          f"on {statistics.median(n for _, n in results):.0f} samples/s, "
          f"on/off median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}, "
          f"{args.rounds} rounds)")


if __name__ == "__main__":
    main()
