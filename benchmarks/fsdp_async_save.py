"""What an asynchronous sharded checkpoint costs the training steps around it (FSDP, CPU/Gloo).

    python benchmarks/fsdp_async_save.py                  # the ~50M-parameter model, 2 ranks
    python benchmarks/fsdp_async_save.py --save-every 0   # no checkpoints: the plain step time

Model: benchmarks/fsdp_memory.py's stack (6 blocks of Linear(H, 4H) + Linear(4H, H), H = 1024:
50.4M parameters), AdamW, batch ``--batch`` per rank, 2 ranks of one thread each. With
``Ring(checkpoint_dir=..., save_every=N)`` the ring starts a sharded save between two steps: it
copies this rank's shards (parameters + AdamW's moments, ~600 MiB / W) to CPU memory, then a
daemon thread writes them while training goes on. Each step is timed and classed as
**launch** (the step whose batch started the save: it pays the copy, and runs beside the writer),
**in flight** (later steps run while the writer thread is still writing), or **normal**.
``--sync`` saves at the same steps with a synchronous ``ring.save`` (sharded) instead: the
training waits for the whole write — what the asynchronous save is compared with. The table gives the median of each
and their ratio to normal; the goal the issue sets is in flight <= 1.2 x normal.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

import ringtrain as rt
from fsdp_memory import make_model


def run(width: int, depth: int, batch: int, steps: int, save_every: int, folder: str, sync: bool = False) -> dict:
    torch.set_num_threads(1)
    periodic = save_every and not sync
    ring = rt.Ring(strategy=rt.strategies.FSDP(), seed=0, checkpoint_dir=folder if periodic else None,
                   save_every=save_every if periodic else None, keep_last=2)
    with torch.device("meta"):
        model = make_model(width, depth)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = ring.setup(model, optimizer)
    g = torch.Generator().manual_seed(ring.rank)
    data = torch.utils.data.TensorDataset(torch.randn(batch * 2 * steps, width, generator=g),
                                          torch.randint(0, 10, (batch * 2 * steps,), generator=g))
    loader = ring.loader(data, batch_size=batch)
    times, kinds = [], []
    it = iter(loader)
    for _ in range(steps):
        saving_before = ring._resumer.saving
        start = time.perf_counter()
        x, y = next(it)  # a due save starts here, before this batch is handed out
        launched = ring._resumer.saving and not saving_before
        if sync and save_every and ring.optimizer_steps and ring.optimizer_steps % save_every == 0:
            ring.save(os.path.join(folder, f"sync-{ring.optimizer_steps}"), model=model, optimizer=optimizer)
            launched = True  # the same point, written before the step goes on (ring.save, sharded)
        ring.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
        kinds.append("launch" if launched else "in flight" if ring._resumer.saving or saving_before else "normal")
    ring._resumer.flush()
    saver = ring._resumer._async  # the ring's writer: how long its last save's two parts took
    ring.close()
    return {"times": times, "kinds": kinds, "staging_s": getattr(saver, "staging_s", 0.0),
            "write_s": getattr(saver, "write_s", 0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=15)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--sync", action="store_true", help="synchronous ring.save at the same steps, to compare")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="ringtrain-async-bench-")
    try:
        ranks = rt.launch(run, args.world, args=(args.width, args.depth, args.batch, args.steps, args.save_every,
                                                  folder, args.sync), timeout=3600)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    # A step is as slow as its slowest rank; skip the first 5 (warm-up).
    times = [max(r["times"][i] for r in ranks) for i in range(args.steps)][5:]
    kinds = [next((r["kinds"][i] for r in ranks if r["kinds"][i] != "normal"), "normal") for i in range(args.steps)][5:]
    normal = statistics.median(t for t, k in zip(times, kinds) if k == "normal")
    print(f"{args.world} ranks, {sum(p.numel() for p in make_model(args.width, args.depth).parameters()) / 1e6:.1f}M "
          f"parameters, batch {args.batch}/rank, save every {args.save_every} steps")
    print("| steps | count | median s | x normal |")
    print("|---|---|---|---|")
    if not args.sync:
        print(f"last save: copy to CPU memory {max(r['staging_s'] for r in ranks):.2f} s (training waits), write in the "
              f"background {max(r['write_s'] for r in ranks):.2f} s")
    for kind in ("normal", "launch", "in flight"):
        chosen = [t for t, k in zip(times, kinds) if k == kind]
        if chosen:
            med = statistics.median(chosen)
            print(f"| {kind} | {len(chosen)} | {med:.3f} | {med / normal:.2f} |")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
