"""What the timeline costs a training loop: the same DDP loop recording a timeline and not.

    python benchmarks/timeline_cost.py                       # 2 Gloo ranks, the MLP of overhead.py, 9 rounds
    python benchmarks/timeline_cost.py --out runs/tl-cost    # and keep the timeline of the "on" rounds there

Both models are set up by one ring in the same processes: "off" is a DDP model with DDP's built-in
all-reduce and no recorder (what every ring without a timeline runs); "on" is the same model, set up
while a recorder was attached, so DDP registered the timed comm hook (torch's Python ``allreduce_hook``
wrapped), and its rounds run with the recorder attached (every phase change recorded); "hook" is the
same model with torch's Python ``allreduce_hook`` unwrapped and no recorder: what the Python hook alone
costs against DDP's C++ all-reduce. Rounds rotate the order of the three. The figure is samples/s over
all ranks; the ratios reported are medians over rounds of on/off and hook/off. Target (issue 20): on costs at most 5 % (>= 0.95); off costs nothing (one ``is None``
test per phase change, nothing else on the path).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ringtrain as rt  # noqa: E402
from overhead import WORKLOADS, dataset, ring_samples_per_s  # noqa: E402
from ringtrain.tracking import timeline  # noqa: E402
from ringtrain.liveness.activity import ACTIVITY  # noqa: E402


ORDER = ("off", "on", "hook")


def rounds(workload: str, n: int, epochs: int, out: str) -> list[tuple[float, float, float]]:
    torch.set_num_threads(1)
    make, shape, samples, batch = WORKLOADS[workload]
    ring = rt.Ring(seed=0, device="cpu")
    loader = ring.loader(dataset(shape, samples), batch_size=batch, shuffle=True)
    models = {}
    for state in ("off", "hook", "on"):
        if state == "on":
            recorder = timeline.start(out, ring.rank, ring.world_size, timeline.job_of(ring.env))
        torch.manual_seed(0)
        model = make()
        models[state] = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
        if state == "hook":
            models[state][0].register_comm_hook(None, default_hooks.allreduce_hook)
    ACTIVITY.recorder = None

    def timed(state: str) -> float:
        model, optimizer = models[state]
        ACTIVITY.recorder = recorder if state == "on" else None
        rate = ring_samples_per_s(ring, model, optimizer, loader, epochs)
        ACTIVITY.recorder = None
        return rate

    for state in ORDER:
        timed(state)  # warm-up (DDP rebuilds its buckets after the first step)
    out_rounds = []
    for i in range(n):
        results = {state: timed(state) for state in ORDER[i % 3:] + ORDER[:i % 3]}
        out_rounds.append((results["off"], results["on"], results["hook"]))
    ACTIVITY.recorder = recorder
    recorder.close()  # the part; the last rank to close merges (timeline.json, timeline.png)
    ring.close()
    return out_rounds


def per_change(n: int = 200_000) -> dict[str, float]:
    """Microseconds per phase change (``ACTIVITY.enter``) and per timed block (``ACTIVITY.timed``), off and
    on, in this process: the recorder's own cost, apart from the noise of a 2-rank loop."""
    out = {}
    folder = tempfile.mkdtemp(prefix="ringtrain-timeline-micro-")
    for state in ("off", "on"):
        recorder = timeline.Recorder(folder, "micro", 0, 1, "micro", merge=False) if state == "on" else None
        ACTIVITY.recorder = recorder
        start = time.perf_counter()
        for _ in range(n):
            ACTIVITY.enter("data")
            ACTIVITY.enter("forward")
        out[f"enter_{state}"] = (time.perf_counter() - start) / (2 * n) * 1e6
        start = time.perf_counter()
        for _ in range(n):
            with ACTIVITY.timed("backward", "sync"):
                pass
        out[f"timed_{state}"] = (time.perf_counter() - start) / n * 1e6
        ACTIVITY.recorder = None
        if recorder is not None:
            recorder.closed = True  # nothing to write
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workload", default="mlp", choices=sorted(WORKLOADS))
    parser.add_argument("--out", default=None, help="where the 'on' rounds' timeline goes (default: a temporary folder)")
    parser.add_argument("--micro", action="store_true", help="only the per-phase-change cost, in this process")
    args = parser.parse_args()
    if args.micro:
        costs = per_change()
        print("µs per phase change: " + ", ".join(f"{k} {v:.3f}" for k, v in costs.items()))
        return
    out = args.out or tempfile.mkdtemp(prefix="ringtrain-timeline-cost-")
    results = rt.launch(rounds, 2, args=(args.workload, args.rounds, args.epochs, out))[0]
    ratios = [on / off for off, on, _ in results]
    hook = [h / off for off, _, h in results]
    print(f"{args.workload}: off {statistics.median(r[0] for r in results):.0f} samples/s, "
          f"on {statistics.median(r[1] for r in results):.0f}, hook {statistics.median(r[2] for r in results):.0f}; "
          f"on/off median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}), "
          f"hook/off {statistics.median(hook):.3f} (range {min(hook):.3f}-{max(hook):.3f}), "
          f"{args.rounds} rounds; the timeline: {out}")


if __name__ == "__main__":
    main()
