"""``ringtrain bench --comm``: all-reduce bus bandwidth by message size, against the link's rate.

The definitions are nccl-tests' (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md):

* time: the mean of ``iters`` back-to-back all-reduces, on the slowest rank;
* algbw = message bytes / time;
* busbw = algbw x 2(n-1)/n — what each rank's link carries in one direction for a ring
  all-reduce of n ranks (each rank sends, and receives, 2(n-1)/n of the message), so it
  is the figure to compare with a link's per-direction rate, independent of n.

Every size is warmed up (``warmup`` calls: Gloo's buffers, TCP's window), then one timed
call sets ``iters`` (the same on every rank: the slowest rank's estimate) so that a size
takes about ``seconds``. The message is float32, summed; its result is checked once.
"""

from __future__ import annotations

import math
import time

import ringtrain as rt

from .netlink import inside, parse_link

KIB = 1024
SIZES = [64 * KIB * 4**i for i in range(6)]  # 64 KiB, 256 KiB, 1 MiB, 4 MiB, 16 MiB, 64 MiB
QUICK_SIZES = SIZES[:5]


def worker(sizes: list[int], warmup: int, seconds: float, threads: int) -> list[dict] | None:
    """One rank: every size in turn; rank 0 returns the rows."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    for size in sizes:
        x = torch.full((size // 4,), float(rank + 1))
        dist.all_reduce(x)
        if x[0].item() != n * (n + 1) / 2 or x[-1].item() != n * (n + 1) / 2:
            raise RuntimeError(f"all-reduce of {size} bytes summed to {x[0].item()}, not {n * (n + 1) / 2}")
        x.zero_()  # zeros from here on: sums of many calls stay finite
        for _ in range(warmup):
            dist.all_reduce(x)
        one = _timed(x, 1)
        iters = max(3, min(1000, math.ceil(seconds / max(one, 1e-6))))
        elapsed = _timed(x, iters)
        mean = elapsed / iters
        algbw = size * 8 / mean
        rows.append({"bytes": size, "elements": size // 4, "world_size": n, "iters": iters, "time_s": mean,
                     "algbw_gbit_s": algbw / 1e9, "busbw_gbit_s": algbw * 2 * (n - 1) / n / 1e9})
    dist.barrier()
    dist.destroy_process_group()
    return rows if rank == 0 else None


def _timed(x, iters: int) -> float:
    """Seconds for ``iters`` all-reduces on the slowest rank (every rank gets the same figure)."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def run(nprocs: list[int], sizes: list[int], warmup: int, seconds: float, threads: int, timeout: float,
        link: str | None) -> tuple[list[dict], dict]:
    """One launch per world size, inside a fresh shaped link when ``link`` is given."""
    import os

    import torch

    spec = parse_link(link) if link else None
    rows: list[dict] = []
    with inside(spec):
        for world in nprocs:
            for row in rt.launch(worker, world, args=(sizes, warmup, seconds, threads), timeout=timeout)[0]:
                row["link"] = str(spec) if spec else ""
                row["link_pct"] = 100 * row["busbw_gbit_s"] * 1e9 / spec.rate_bps if spec else None
                rows.append(row)
    meta = {"workload": "allreduce", "backend": "gloo", "dtype": "float32", "op": "sum", "warmup": warmup,
            "seconds_per_size": seconds, "threads_per_rank": threads, "torch": torch.__version__,
            "cpu_count": os.cpu_count(), "link": str(spec) if spec else None,
            "link_rate_bps": spec.rate_bps if spec else None, "link_delay_s": spec.delay_s if spec else None}
    return rows, meta


COLUMNS = ["workload", "link", "world_size", "bytes", "elements", "iters", "time_s", "algbw_gbit_s", "busbw_gbit_s",
           "link_pct"]


def _size(n: int) -> str:
    return f"{n // (1024 * KIB)} MiB" if n >= 1024 * KIB else f"{n // KIB} KiB"


def table(rows: list[dict], meta: dict) -> str:
    link = meta.get("link")
    where = (f"--link {link}: a private network namespace whose loopback carries {link.split(',')[0]} per direction "
             f"of each connection" + (f", +{link.split(',')[1]} one way" if "," in link else "")) if link \
        else "the plain loopback (no --link)"
    lines = [f"ringtrain bench --comm: Gloo all-reduce (float32, sum) over {where}",
             "  busbw = algbw x 2(n-1)/n (nccl-tests); time = mean of iters calls on the slowest rank, after "
             f"{meta['warmup']} warm-up calls; torch {meta['torch']}, {meta['threads_per_rank']} thread(s) per rank",
             "",
             f"{'size':>8}  {'W':>2}  {'iters':>5}  {'time ms':>9}  {'algbw Gbit/s':>12}  {'busbw Gbit/s':>12}"
             + ("  % of link" if link else "")]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        lines.append(f"{_size(r['bytes']):>8}  {r['world_size']:>2}  {r['iters']:>5}  {r['time_s'] * 1e3:>9.3f}  "
                     f"{r['algbw_gbit_s']:>12.3f}  {r['busbw_gbit_s']:>12.3f}"
                     + (f"  {r['link_pct']:>9.0f}" if r.get("link_pct") is not None else ""))
    return "\n".join(lines)
