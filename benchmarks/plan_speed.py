"""How long ``rt.plan`` takes on a 1.5 B-parameter model, on this machine's CPU (nothing allocated: fake tensors).

    python benchmarks/plan_speed.py                 # one device, then every layout of 8 ranks
    python benchmarks/plan_speed.py --one           # one layout (one device) only

The model is examples/llama.py's ``--size 1b`` (Llama 3.2 1B's shape, untied embeddings: 1.498 B parameters),
built on the meta device, with fp32 AdamW, batch 1 x sequence 2048. Prints each layout's planning time, peak per
rank and step time, the total, the process's peak RSS, and writes the plan to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import llama  # noqa: E402 - examples/ is put on the path first

import ringtrain as rt  # noqa: E402
from ringtrain.planning.layouts import Layout  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", action="store_true", help="the one-device layout only")
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--precision", default="32")
    parser.add_argument("--out", default="plan-1b")
    args = parser.parse_args()
    model, vocab, seq = llama.build("1b")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    batch = torch.randint(0, vocab, (1, seq), device="meta")
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B parameters; torch {torch.__version__}, "
          f"{os.cpu_count()} CPU(s)", flush=True)
    started = time.perf_counter()
    one = rt.plan(model, optimizer, batch, world_size=1, device="h100", precision=args.precision,
                  layouts=[Layout("single")])
    print(f"one device: {one.rows[0].trace_s:.1f} s wall, {one.rows[0].trace_cpu_s:.1f} s CPU, peak "
          f"{one.rows[0].peak / 2**30:.2f} GiB", flush=True)
    if not args.one:
        every = rt.plan(model, optimizer, batch, world_size=args.world, device="h100", precision=args.precision)
        print(every.table())
        for row in every.rows:
            print(f"  {row.layout:32s} {row.trace_s:6.1f} s wall {row.trace_cpu_s:6.1f} s CPU  "
                  f"{'error: ' + row.error if row.error else ''}")
        print(f"all {len(every.rows)} layouts of {args.world} ranks: {sum(r.trace_s for r in every.rows):.1f} s wall, "
              f"{sum(r.trace_cpu_s for r in every.rows):.1f} s CPU")
        every.save(args.out)
    print(f"total {time.perf_counter() - started:.1f} s wall, {time.process_time():.1f} s CPU (import included); "
          f"peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB")


if __name__ == "__main__":
    main()
