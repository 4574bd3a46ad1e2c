"""``ringtrain bench --preset gpu``: CIFAR ResNet-18 images/s and MFU on CUDA GPUs, ringtrain vs the raw loop.

The whole data set lives on the GPU (no loader, no host copies: the GPU's speed, not
the input pipeline's); each epoch takes a seeded permutation and each rank a strided
share of it, ``--batch-size`` images per GPU per step (default 512). Configurations:
precision (32 / bf16-mixed / 16-mixed) x channels_last (off / on) x torch.compile (with
``--compile``, on the channels_last variants), each run as ringtrain
(Ring + setup + backward) and as the raw loop (autocast + GradScaler, DDP when W > 1),
alternating which goes first on every repeat. A measurement is one epoch between
``torch.cuda.synchronize()`` calls; the figure is the median over ``--repeats``.

MFU (model FLOPs utilisation) = images/s x training FLOPs per image / (GPUs x peak).
Training FLOPs are counted with torch's FlopCounterMode on the real model (forward +
backward, 2 FLOPs per multiply-add): 3.33 GFLOP per 32x32 image — the often-quoted
"0.56 GFLOPs" of CIFAR ResNet-18 counts multiply-adds of the forward pass only. The
peak is the GPU's dense bf16/fp16 tensor-core rate (table below, or ``--peak-tflops``),
for every precision, so fp32 rows show how far they are from it.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ringtrain as rt

from ..errors import RingtrainError, pyplot
from ..loop.precision import bf16_problem
from .datasets import cifar100
from .names import EXTRA
from .workloads import _resnet18

# Dense (no sparsity) bf16 tensor-core peak, TFLOP/s, from the vendors' data sheets; first match wins.
PEAK_BF16_TFLOPS = [
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("GH200", 989.4), ("H200", 989.4), ("H100", 989.4),
    ("A100", 312.0), ("L40S", 362.0), ("L4", 121.0), ("A10", 125.0),
]
CIFAR_IMAGES = 50_000


def require_cuda() -> int:
    if not torch.cuda.is_available():
        raise RingtrainError(
            f"--preset gpu measures CUDA GPUs, but torch {torch.__version__} sees none "
            f"(torch.version.cuda={torch.version.cuda}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})",
            "run it on a machine with an NVIDIA GPU and a CUDA build of torch; on CPUs use `ringtrain bench --quick` "
            "(the digits) or `ringtrain bench --workload cifar-resnet18 --quick` (a smaller ResNet on fewer images): "
            "minutes on 2 cores, where the full CIFAR sizes take hours to days (the bench says so before it starts).",
        )
    return torch.cuda.device_count()


def peak_tflops(name: str, given: float | None) -> float | None:
    if given:
        return given
    return next((tflops for key, tflops in PEAK_BF16_TFLOPS if key in name), None)


def train_flops_per_image(width: int = 64) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    model = _resnet18(width)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(torch.randn(2, 3, 32, 32)), torch.zeros(2, dtype=torch.long)).backward()
    return counter.get_total_flops() / 2


def _data(opts: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    if opts["data"]:
        x, y = cifar100(opts["data"], "train").tensors
        return x.to(device), y.to(device)
    g = torch.Generator(device=device).manual_seed(0)
    n = opts.get("images", CIFAR_IMAGES)
    prototypes = torch.randn(100, 3, 32, 32, generator=g, device=device)
    y = torch.randint(0, 100, (n,), generator=g, device=device)
    return prototypes[y] * 0.5 + torch.randn(n, 3, 32, 32, generator=g, device=device), y


class Loop:
    """One training loop (ringtrain's or the raw one) for one configuration."""

    def __init__(self, impl: str, precision: str, channels_last: bool, compiled: bool, device: torch.device, world: int,
                 width: int = 64):
        from torch.nn.parallel import DistributedDataParallel as DDP

        fmt = torch.channels_last if channels_last else torch.contiguous_format
        torch.manual_seed(0)
        model = _resnet18(width).to(memory_format=fmt)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        self.ring = None
        if impl == "ringtrain":
            with contextlib.redirect_stdout(io.StringIO()):
                self.ring = rt.Ring(precision=precision, seed=0, device=device.type)
            model, optimizer = self.ring.setup(model, optimizer)
        else:
            model = model.to(device)
            if world > 1:
                model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
            dtype = {"32": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}[precision]
            self.autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else contextlib.nullcontext
            self.scaler = torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)
        # Both rows compile the module as it is trained, DDP-wrapped when W > 1 (torch's
        # recommended order): like with like. The Ring's autocast hooks stay outside the graph.
        self.model = torch.compile(model) if compiled else model
        self.optimizer = optimizer

    def close(self) -> None:
        if self.ring is not None:  # the Ring's atexit registration would keep its model alive
            import atexit

            self.ring.close()
            atexit.unregister(self.ring.close)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.ring is not None:
            self.ring.backward(F.cross_entropy(self.model(x), y))
            self.optimizer.step()
            self.optimizer.zero_grad()
            return
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss = F.cross_entropy(self.model(x), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()


def preset_worker(opts: dict) -> dict | None:
    """One rank of the preset: every configuration, ringtrain and raw alternating; rank 0 returns rows.

    CUDA is what it is for (the CLI refuses to start without it); ``opts["device"] = "cpu"``
    (with small ``images``/``width``) runs the same code on a CPU, for the tests.
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = opts.get("device", "cuda") == "cuda"
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True  # the raw loop's line from every CIFAR tutorial; the Ring sets it too
    else:
        torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    x_all, y_all = _data(opts, device)
    layouts = {False: x_all.contiguous(), True: x_all.permute(0, 2, 3, 1).contiguous()}  # NCHW / NHWC storage
    batch, n = opts["batch_size"], len(x_all)
    steps = opts["steps"] or n // (batch * world)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"

    def batches(epoch: int, channels_last: bool, count: int):
        order = torch.randperm(n, generator=torch.Generator(device=device).manual_seed(epoch), device=device)
        mine = order[rank::world]
        per_epoch = len(mine) // batch
        for i in range(count):
            idx = mine[(i % per_epoch) * batch : (i % per_epoch + 1) * batch]
            xb = layouts[channels_last][idx]
            yield (xb.permute(0, 3, 1, 2) if channels_last else xb), y_all[idx]  # NHWC storage = channels_last view

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)
        if world > 1:
            dist.barrier()

    def peak_mib() -> float:
        if cuda:
            return torch.cuda.max_memory_allocated(device) / 2**20
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10

    rows = []
    configs = [(p, cl, c) for p in opts["precisions"] for cl in (False, True)
               for c in ((False, True) if opts["compile"] and cl else (False,))]
    for precision, channels_last, compiled in configs:
        loops, times, peaks, errors = {}, {"ringtrain": [], "raw": []}, {"ringtrain": 0.0, "raw": 0.0}, {}
        for impl in ("ringtrain", "raw"):
            problem = bf16_problem(device) if precision == "bf16-mixed" else None  # after set_device, this GPU
            if problem:
                errors[impl] = f"SKIPPED: {problem}"
                continue
            try:
                loops[impl] = Loop(impl, precision, channels_last, compiled, device, world, opts.get("width", 64))
                for xb, yb in batches(10_000, channels_last, opts["warmup"]):
                    loops[impl].step(xb, yb)
            except Exception as e:  # e.g. torch.compile failing on this build: report it, go on with the rest
                errors[impl] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                loops.pop(impl, None)
        for r in range(opts["repeats"]):
            for impl in (("ringtrain", "raw") if r % 2 == 0 else ("raw", "ringtrain")):
                if impl not in loops:
                    continue
                if cuda:
                    torch.cuda.reset_peak_memory_stats(device)
                sync()
                start = time.perf_counter()
                for xb, yb in batches(r, channels_last, steps):
                    loops[impl].step(xb, yb)
                sync()
                times[impl].append(time.perf_counter() - start)
                peaks[impl] = max(peaks[impl], peak_mib())
        for impl in ("ringtrain", "raw"):
            rates = [steps * batch * world / t for t in times[impl]]
            rows.append({"impl": impl, "precision": precision, "channels_last": channels_last, "compile": compiled,
                         "gpus": world, "batch_per_gpu": batch, "images_per_s": statistics.median(rates) if rates else None,
                         "images_per_s_min": min(rates, default=None), "images_per_s_max": max(rates, default=None),
                         "peak_mem_mib": peaks[impl], "error": errors.get(impl), "_rates": rates})
        for loop in loops.values():
            loop.close()
        del loops
        if cuda:
            torch.cuda.empty_cache()
    if world > 1:
        dist.destroy_process_group()
    return {"rows": rows, "device_name": name} if rank == 0 else None


def run_preset(opts: dict) -> tuple[list[dict], dict]:
    """Launch the preset for each GPU count in ``opts["nprocs"]``; rows with MFU and ratio vs raw, and meta."""
    gpus = require_cuda() if opts.get("device", "cuda") == "cuda" else max(opts["nprocs"])
    too_many = [w for w in opts["nprocs"] if w > gpus]
    if too_many:
        raise RingtrainError(f"--nprocs {too_many} asks for more GPUs than the {gpus} this machine has",
                             f"use --nprocs values up to {gpus} (one process per GPU).")
    flops = train_flops_per_image(opts.get("width", 64))  # on the CPU: the parent leaves CUDA to the spawned ranks
    rows: list[dict] = []
    name = ""
    for world in opts["nprocs"]:
        out = rt.launch(preset_worker, world, args=(opts,), timeout=opts["timeout"])[0]
        rows += out["rows"]
        name = out["device_name"]
    peak = peak_tflops(name, opts.get("peak_tflops"))
    for row in rows:
        raw = next(r for r in rows if r["impl"] == "raw" and all(r[k] == row[k] for k in
                                                                 ("precision", "channels_last", "compile", "gpus")))
        ips = row["images_per_s"]
        row["epoch_s"] = CIFAR_IMAGES / ips if ips else None
        row["mfu"] = ips * flops / (row["gpus"] * peak * 1e12) if ips and peak else None
        pairs = [a / b for a, b in zip(row["_rates"], raw["_rates"])]  # same repeat, back to back
        row["ratio_vs_raw"] = statistics.median(pairs) if pairs else None
    for row in rows:
        row["rates"] = row.pop("_rates")
    meta = {"preset": "gpu", "device_name": name, "gpus_available": gpus, "peak_bf16_tflops": peak,
            "train_flops_per_image": flops, "torch": torch.__version__, "cuda": torch.version.cuda,
            "config": {k: v for k, v in opts.items()}}
    return rows, meta


def preset_table(rows: list[dict], meta: dict) -> str:
    peak = meta["peak_bf16_tflops"]
    lines = [
        f"ringtrain bench --preset gpu: CIFAR ResNet-18 (11.2M parameters), data resident on the GPU, "
        f"{meta['config']['batch_size']} images per GPU per step",
        f"  {meta['device_name']}, torch {meta['torch']} (CUDA {meta['cuda']}); training FLOPs/image "
        f"{meta['train_flops_per_image'] / 1e9:.2f} G; MFU vs dense bf16 peak "
        + (f"{peak:.0f} TFLOP/s" if peak else "unknown (pass --peak-tflops)"),
        "",
        f"{'impl':<10} {'GPUs':>4} {'precision':<10} {'ch_last':<7} {'compile':<7} {'images/s':>9} {'±%':>4} "
        f"{'s/epoch':>8} {'MFU':>6} {'peak MiB':>9} {'vs raw':>7}",
    ]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        head = (f"{r['impl']:<10} {r['gpus']:>4} {r['precision']:<10} {'on' if r['channels_last'] else 'off':<7} "
                f"{'on' if r['compile'] else 'off':<7} ")
        if r["images_per_s"] is None:
            error = r["error"] or "no measurement"
            lines.append(head + (error if error.startswith("SKIPPED") else f"FAILED: {error}"))
            continue
        spread = 100 * (r["images_per_s_max"] - r["images_per_s_min"]) / 2 / r["images_per_s"]
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        ratio = f"{r['ratio_vs_raw']:.3f}" if r["ratio_vs_raw"] is not None else "-"
        lines.append(head + f"{r['images_per_s']:>9.0f} {spread:>4.0f} {r['epoch_s']:>8.2f} {mfu:>6} "
                            f"{r['peak_mem_mib']:>9.0f} {ratio:>7}")
    return "\n".join(lines)


def preset_png(rows: list[dict], meta: dict, path: str) -> str:
    plt = pyplot(EXTRA, "throughput.png")

    ok = [r for r in rows if r["images_per_s"]]
    labels = list(dict.fromkeys(_label(r) for r in ok))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(labels) + 2), 4.2))
    for i, impl in enumerate(("ringtrain", "raw")):
        xs = [labels.index(_label(r)) + (i - 0.5) * 0.4 for r in ok if r["impl"] == impl]
        ax.bar(xs, [r["images_per_s"] for r in ok if r["impl"] == impl], 0.4, label=impl)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("images/s (median)")
    ax.set_title(f"CIFAR ResNet-18 on {meta['device_name']}", fontsize=10)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _label(row: dict) -> str:
    return (f"{row['gpus']}x {row['precision']}" + (" CL" if row["channels_last"] else "")
            + (" compiled" if row["compile"] else ""))
