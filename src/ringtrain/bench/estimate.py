"""How long a bench will take, said before it starts: a CIFAR bench on a CPU ran for hours with
nothing said up front.

The workload's own model is timed here, in the parent, before any process starts: one optimizer step on a few
samples (the first, which pays for allocation, untimed; then the fastest of three), for each precision on the CPU, with the torch threads
of one rank. The runs the bench plans are then multiplied out: each run is ``warmup + timed`` optimizer steps
of the global batch, and W ranks share its samples over min(W, usable cores) cores; the evaluation of the last
repeat is a forward pass over the test set; each launch (its processes starting and importing torch) and each
run (a fresh model, its barrier) add what they took here. Communication and a machine that is busy with
something else are not in it: read the figure as "minutes" or "hours", not to the second. CPU runs only (a GPU
bench is quick, and timing on a GPU here would initialise CUDA in the parent).
"""

from __future__ import annotations

import time

import torch

from .workloads import Workload

PROBE_SAMPLES = 32  # what one timed step trains on: per-sample cost is what scales
TIMED_STEPS = 3  # the fastest of these counts: a step that another process interrupted says little
LONG_S = 10 * 60.0  # past this, the bench offers its quick form before starting
FORWARD_SHARE = 1 / 3  # a forward pass is about a third of forward + backward + step
# Measured on the 2-core CPU: `bench --quick`'s 42 runs of one launch took 24 s (1 rank) and 34 s
# (2 ranks) where the steps alone were a few seconds; a launch starts its processes, which import torch.
LAUNCH_S = 4.0
RUN_S = 0.6


def seconds_per_sample(wl: Workload, precision: str, threads: int) -> float:
    """One optimizer step of ``wl``'s model on a few samples, on the CPU with ``threads`` torch threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        model = wl.make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=wl.lr)
        x, y = (t[:PROBE_SAMPLES] for t in wl.train.tensors)
        dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
        took = []
        for _ in range(1 + TIMED_STEPS):
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                loss = wl.loss(model(x), y)
            loss.float().backward()
            optimizer.step()
            optimizer.zero_grad()
            took.append(time.perf_counter() - start)
        return min(took[1:]) / len(x)
    finally:
        torch.set_num_threads(before)


def total_seconds(wl: Workload, launches: dict[int, list[str]], precisions: list[str], repeats: int, warmup: int,
                  timed: int, per_sample: dict[str, float], cores: int) -> float:
    """The runs of ``launches`` (world size -> modes) at ``per_sample`` seconds per sample and precision."""
    total = 0.0
    for world, modes in launches.items():
        share = min(world, cores)
        total += LAUNCH_S + len(modes) * len(precisions) * repeats * RUN_S
        for precision in precisions:
            train = len(modes) * repeats * (warmup + timed) * wl.global_batch * per_sample[precision] / share
            evaluate = len(modes) * len(wl.test) * per_sample[precision] * FORWARD_SHARE  # rank 0, last repeat
            total += train + evaluate
    return total


def words(seconds: float) -> str:
    """``about 5 h 20 min``, ``about 3 min``, ``under a minute``."""
    if seconds < 60:
        return "under a minute"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"about {minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"about {hours} h {minutes} min" if hours < 48 else f"about {round(seconds / 86400)} days"
