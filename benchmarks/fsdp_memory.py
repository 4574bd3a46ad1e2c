"""FSDP on CPU/Gloo: what each rank holds, and its peak memory, at W = 1, 2, 4 — and a model never whole.

    python benchmarks/fsdp_memory.py                      # the ~50M-parameter model at W = 1, 2, 4
    python benchmarks/fsdp_memory.py --width 2048 --worlds 4 --meta-only   # ~200M: never whole anywhere

Model: an embedding-free stack of ``--depth`` blocks, each Linear(H, 4H) + GELU + Linear(4H, H)
(8.4M parameters at H = 1024: 6 blocks = 50.4M), the blocks being FSDP's units, trained by
AdamW. After one step each rank counts, from the tensors it holds, the bytes of its parameters,
gradients and optimizer state (exact: the local shards of the DTensors), and reads its peak
resident memory (``getrusage``'s ``ru_maxrss``, whose high-water mark is reset after the process
group forms, so the table's peak is what the model and its training added on top of a Python
with torch imported and a group joined — that base is shown beside it).

Two ways to build the model: **normal** — every rank builds it whole on the CPU (as DDP
scripts do), ``ring.setup`` shards it; **meta** — built under ``torch.device("meta")``, sharded,
then only this rank's shards are allocated and initialised (materialize.py). The bound the issue
sets: held bytes <= 1.1 x (full / W) + the largest unit (one block, whole). ``--strategy ddp``
measures the same model under DDP (every rank holds everything) for comparison.

On the CPU, glibc's malloc keeps freed large buffers in its heap (FSDP gathers and frees a whole
unit per layer per step), so the process's RSS stays above what it holds;
``MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/fsdp_memory.py`` makes large buffers go back to
the system when freed, and the peak then tracks the held state plus about one unit.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import time

import torch
import torch.nn.functional as F
from torch import nn

import ringtrain as rt


def make_model(width: int, depth: int) -> nn.Sequential:
    blocks = [nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)) for _ in range(depth)]
    return nn.Sequential(*blocks, nn.Linear(width, 10))


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _bytes(tensors) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure(width: int, depth: int, meta: bool, batch: int, strategy: str = "fsdp") -> dict:
    torch.set_num_threads(1)
    ring = rt.Ring(strategy=rt.strategies.FSDP() if strategy == "fsdp" else strategy, seed=0)
    gc.collect()
    base = _rss_mib()
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak RSS high-water mark (proc(5))
        f.write("5")
    start = time.perf_counter()
    if meta:
        with torch.device("meta"):
            model = make_model(width, depth)
    else:
        model = make_model(width, depth)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = ring.setup(model, optimizer)
    setup_s = time.perf_counter() - start
    g = torch.Generator().manual_seed(ring.rank)
    x, y = torch.randn(batch, width, generator=g), torch.randint(0, 10, (batch,), generator=g)
    start = time.perf_counter()
    ring.backward(F.cross_entropy(model(x), y))
    optimizer.step()  # Adam's state now exists; the gradients are kept (zero_grad not called) to be counted
    step_s = time.perf_counter() - start
    params = list(model.parameters())
    held = {
        "params": _bytes(params),
        "grads": _bytes(p.grad for p in params if p.grad is not None),
        "optimizer": _bytes(v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)),
    }
    out = {"rank": ring.rank, "world": ring.world_size, "meta": meta, "held": held, "held_total": sum(held.values()),
           "base_rss_mib": base, "peak_rss_mib": _peak_mib(), "setup_s": setup_s, "step_s": step_s,
           "units": len(getattr(ring.strategy, "units", []))}
    ring.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--worlds", default="1,2,4")
    parser.add_argument("--meta-only", action="store_true")
    parser.add_argument("--strategy", default="fsdp", help="fsdp, or ddp for the unsharded comparison")
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()
    model = make_model(args.width, args.depth)
    n = sum(p.numel() for p in model.parameters())
    unit = sum(p.numel() for p in model[0].parameters()) * 4
    full = n * 4 * 4  # fp32 parameters + gradients + AdamW's two moments
    del model
    print(f"model: {n / 1e6:.1f}M parameters; full training state (params + grads + AdamW) {full / 2**20:.0f} MiB; "
          f"largest unit {unit / 2**20:.0f} MiB")
    print("| W | build | held per rank (params/grads/optim) MiB | bound 1.1xfull/W+unit MiB | base RSS MiB | "
          "peak RSS - base MiB | peak RSS MiB | setup s | step s |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        for meta in ((True,) if args.meta_only else (False,) if args.strategy != "fsdp" else (False, True)):
            got = rt.launch(measure, world, args=(args.width, args.depth, meta, args.batch, args.strategy),
                            timeout=1800)
            worst = max(got, key=lambda r: r["held_total"])
            peak = max(got, key=lambda r: r["peak_rss_mib"])
            bound = 1.1 * full / world + unit
            h = worst["held"]
            build = ("meta" if meta else "normal") + ("" if args.strategy == "fsdp" else f" ({args.strategy})")
            print(f"| {world} | {build} | {worst['held_total'] / 2**20:.0f} "
                  f"({h['params'] / 2**20:.0f}/{h['grads'] / 2**20:.0f}/{h['optimizer'] / 2**20:.0f}) | "
                  f"{bound / 2**20:.0f} | {peak['base_rss_mib']:.0f} | {peak['peak_rss_mib'] - peak['base_rss_mib']:.0f} | "
                  f"{peak['peak_rss_mib']:.0f} | {max(r['setup_s'] for r in got):.1f} | "
                  f"{max(r['step_s'] for r in got):.1f} |", flush=True)
            rows.append({"world": world, "meta": meta, "params": n, "full_bytes": full, "unit_bytes": unit,
                         "bound_bytes": bound, "ranks": got})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
