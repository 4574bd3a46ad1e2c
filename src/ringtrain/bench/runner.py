"""Runs the measurements: one launch of W processes per world size, every mode inside it.

Method (docs/bench.md explains it for users):

* Each run builds its mode's model, optimizer and loader from scratch (seeded), trains
  ``warmup`` optimizer steps untimed (allocator, autotuning, first-touch costs), then
  times ``timed`` optimizer steps between a device synchronise and a barrier at each
  end. Every mode steps on the same global batch, so every run processes the same
  number of samples; the run records the count it actually saw, to be checked.
* A measurement is repeated ``repeats`` times; the order of the modes alternates
  (forward on even repeats, reversed on odd), so slow drift in machine load — other
  jobs on a shared box — hits every mode alike. Ratios (vs raw-ddp) pair the runs of
  the same repeat, which ran next to each other in the same processes.
* A mode that cannot run is recorded as skipped, with why. A mode that crashes (or
  hangs past the timeout) is recorded as failed, with the error, and the remaining
  modes run again in fresh processes.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

import ringtrain as rt

from ..errors import RingtrainError
from . import workloads
from .modes import MODES, Skip, make_trainer, precision_problem, static_skip


@dataclass
class Config:
    workload: str = "digits-cnn"
    modes: list[str] = field(default_factory=lambda: list(MODES))
    precisions: list[str] = field(default_factory=lambda: ["32"])
    nprocs: list[int] = field(default_factory=lambda: [1, 2])
    epochs: int | None = 1
    steps: int | None = None
    batch_size: int | None = None
    accumulate: int = 4
    repeats: int = 5
    warmup: int = 3
    quick: bool = False
    width: int | None = None
    samples: int | None = None
    data: str | None = None
    device: str = "auto"  # auto / cpu / cuda
    threads: int = 1  # torch threads per rank on CPU (torchrun's OMP_NUM_THREADS=1 default)
    timeout: float = 1800.0
    progress: bool = True
    sync_bn: bool = False  # SyncBatchNorm in every mode (seed 004's timings had it on)

    def build_workload(self) -> workloads.Workload:
        return workloads.build(self.workload, quick=self.quick, width=self.width, samples=self.samples,
                               batch_size=self.batch_size, data=self.data)


# --- inside the launched processes ---------------------------------------------------------


def _reset_peak_memory(device: torch.device) -> bool:
    """Start a fresh memory high-water mark; False where the OS does not allow it (then it is lifetime)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        # Linux: writing 5 to clear_refs resets the peak RSS that getrusage reports (proc(5)).
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def _run_once(mode: str, wl: workloads.Workload, precision: str, cfg: Config, timed: int, evaluate: bool) -> dict:
    gc.collect()
    device = _device(cfg)
    resettable = _reset_peak_memory(device)
    trainer = make_trainer(mode, wl, precision, cfg.device, cfg.accumulate, cfg.sync_bn)
    gpus = cuda_devices_of(trainer)

    def sync() -> None:
        for gpu in gpus:
            torch.cuda.synchronize(gpu)
    spe = len(wl.train) // wl.global_batch
    batches = trainer.batches(math.ceil((cfg.warmup + timed) / spe))
    steps = 0
    while steps < cfg.warmup:
        steps += trainer.step(*next(batches))[1]
    last_from = cfg.warmup + timed - min(timed, spe)  # the final loss averages the last epoch's steps
    samples, loss_sum, loss_n = 0, torch.zeros((), device=device), 0
    sync()
    dist.barrier()
    trainer.comm.reset()
    start = time.perf_counter()
    while steps < cfg.warmup + timed:
        x, y = next(batches)
        loss, stepped = trainer.step(x, y)
        samples += x.shape[0]
        if steps >= last_from:
            loss_sum += loss.detach().float()
            loss_n += 1
        steps += stepped
    sync()
    dist.barrier()
    elapsed = time.perf_counter() - start
    batches.close()
    comm_bytes, allreduces = trainer.comm_per_step(timed)
    peak = _peak_memory_mib(device)  # training's peak, before evaluation adds its own
    model = trainer.eval_model()
    metric = wl.evaluate(model, device) if evaluate and model is not None and dist.get_rank() == 0 else None
    # Which BatchNorm layers this run trained with: --sync-bn must show SyncBatchNorm here.
    norms = sorted({type(m).__module__ + "." + type(m).__name__ for m in (model.modules() if model is not None else ())
                    if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)})
    mine = {"samples": samples * trainer.sample_share, "loss": (loss_sum / max(loss_n, 1)).item(),
            "elapsed": elapsed, "peak": peak, "comm": comm_bytes, "calls": allreduces}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    comm_method, devices = trainer.comm.method, trainer.devices
    trainer.close()
    del trainer, model
    total = round(sum(r["samples"] for r in everyone))
    seconds = max(r["elapsed"] for r in everyone)
    comm = [r["comm"] for r in everyone if r["comm"] is not None]
    return {
        "status": "ok", "mode": mode, "precision": precision, "processes": dist.get_world_size(),
        "seconds": seconds, "samples": total, "optimizer_steps": timed, "global_batch": total / timed,
        "samples_per_s": total / seconds, "epoch_samples": spe * wl.global_batch,
        "peak_mem_mib": max(r["peak"] for r in everyone),
        "memory_method": ("torch.cuda.max_memory_allocated" if device.type == "cuda" else
                          "getrusage ru_maxrss, reset per run" if resettable else "getrusage ru_maxrss, process lifetime"),
        "comm_bytes_per_step": max(comm) if comm else None, "allreduces_per_step": everyone[0]["calls"],
        "comm_method": comm_method, "devices": devices,
        "final_loss": sum(r["loss"] for r in everyone) / len(everyone), "metric": metric, "norm_layers": norms,
    }


def cuda_devices_of(trainer: Any) -> list[torch.device]:
    """The GPUs this rank's run computes on, to wait for before reading a timer: its strategy's
    devices (dp's replicas span several; every other mode runs on one).

    Only those: synchronizing a GPU creates a CUDA context on it (~0.5 GiB each), and
    waiting on GPUs other ranks drive would tie this rank's timings to their work.
    """
    if trainer.device.type != "cuda":
        return []
    ring = getattr(trainer, "ring", None)  # RawDDPTrainer has none
    if ring is not None:
        return [device for device in ring.strategy.devices if device.type == "cuda"]
    return [trainer.device]


def _device(cfg: Config) -> torch.device:
    if cfg.device != "cpu" and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def worker(cfg: Config, modes: list[str], journal: str) -> dict | None:
    """One launched rank: every mode x precision x repeat, in alternating order; rank 0 returns the records."""
    from tqdm.auto import tqdm

    device = _device(cfg)
    if device.type == "cpu":
        torch.set_num_threads(cfg.threads)
    else:
        torch.cuda.set_device(device)
    # The tutorial's first line; every mode (ringtrain's and the raw loop) reuses this one group.
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    wl = cfg.build_workload()
    # Everything alive now (modules, data) lives to the end: keep it out of the per-run gc.collect(),
    # which otherwise spends ~0.3 s per run walking torch's and scikit-learn's objects.
    gc.freeze()
    spe = len(wl.train) // wl.global_batch
    timed = cfg.steps if cfg.steps else cfg.epochs * spe
    records: list[dict] = []
    skipped: dict[tuple[str, str], str] = {}
    bar = tqdm(total=len(cfg.precisions) * cfg.repeats * len(modes), desc=f"{wl.name}, {world} process(es)",
               disable=rank != 0 or not cfg.progress, dynamic_ncols=True, leave=True, file=sys.stderr)
    for precision in cfg.precisions:
        problem = precision_problem(precision, device)
        for repeat in range(cfg.repeats):
            for mode in modes if repeat % 2 == 0 else modes[::-1]:
                if (mode, precision) in skipped:
                    bar.update(1)
                    continue
                bar.set_postfix_str(f"{mode} {precision}", refresh=False)
                if rank == 0:
                    with open(journal, "a") as f:
                        f.write(json.dumps({"mode": mode, "precision": precision, "repeat": repeat}) + "\n")
                try:
                    if problem:
                        raise Skip(problem)
                    record = _run_once(mode, wl, precision, cfg, timed, evaluate=repeat == cfg.repeats - 1)
                except Skip as e:
                    skipped[(mode, precision)] = str(e)
                    record = {"status": "skipped", "mode": mode, "precision": precision, "processes": world,
                              "reason": str(e)}
                record["repeat"] = repeat
                records.append(record)
                bar.update(1)
    bar.close()
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return None
    meta = {"workload": wl.name, "describe": wl.describe, "parameters": wl.params, "train_samples": len(wl.train),
            "global_batch": wl.global_batch, "steps_per_epoch": spe, "timed_steps": timed,
            "metric_name": wl.metric_name, "device": str(device), "threads_per_rank": cfg.threads,
            "model": wl.model_name, "dataset": wl.data_name, "sync_bn": cfg.sync_bn,
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()}
    return {"meta": meta, "records": records}


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    import platform

    return platform.processor() or "cpu"


# --- in the parent -------------------------------------------------------------------------


def _failure_reason(error: Exception) -> str:
    """The child's exception line out of launch's message (its traceback), or the message's first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("HINT:"):
            continue
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Interrupt")) and " " not in head:
            return line[:300]
    return lines[0][:300] if lines else type(error).__name__


def plan(cfg: Config) -> tuple[dict[int, list[str]], list[dict]]:
    """The launches the bench makes (world size -> its modes) and the records of what cannot run here."""
    cuda = torch.cuda.device_count() if cfg.device != "cpu" and torch.cuda.is_available() else 0
    batch = cfg.batch_size or workloads.default_batch(cfg.workload, cfg.quick)
    records: list[dict] = []
    launches: dict[int, list[str]] = {}
    for mode in cfg.modes:
        worlds = [1] if mode in ("single", "dp") else cfg.nprocs
        for world in worlds:
            reason = static_skip(mode, world, cfg.workload, cuda, cfg.accumulate, batch)
            if reason:
                records += [{"status": "skipped", "mode": mode, "precision": p, "processes": world, "reason": reason}
                            for p in cfg.precisions]
            else:
                launches.setdefault(world, []).append(mode)
    return launches, records


def run(cfg: Config, journal_dir: str) -> dict:
    """Every planned launch; returns {"meta": ..., "records": [...]} with skipped and failed entries included."""
    launches, records = plan(cfg)
    meta: dict = {}
    for world in sorted(launches):
        pending = list(launches[world])
        while pending:
            journal = os.path.join(journal_dir, f"journal-{world}.jsonl")
            with contextlib.suppress(FileNotFoundError):
                os.remove(journal)
            try:
                out = rt.launch(worker, world, args=(cfg, pending, journal), timeout=cfg.timeout)[0]
            except RingtrainError as e:
                # The journal's last line is the run that was going when the job died: drop that mode, rerun the rest.
                started = _last_started(journal)
                if started is None:  # died before any run began: nothing to blame on one mode
                    raise
                culprit, reason = started["mode"], _failure_reason(e)
                print(f"ringtrain bench: {culprit} with {world} process(es) failed: {reason}", file=sys.stderr)
                records += [{"status": "failed", "mode": culprit, "precision": p, "processes": world, "reason": reason}
                            for p in cfg.precisions]
                pending.remove(culprit)
                continue
            meta = out["meta"]
            records += out["records"]
            break
    if not meta:
        meta = {"workload": cfg.workload, "device_name": "", "describe": cfg.workload}
    meta.update(config=asdict(cfg), torch=torch.__version__, cpu_count=os.cpu_count())
    return {"meta": meta, "records": records}


def _last_started(journal: str) -> dict | None:
    try:
        with open(journal) as f:
            lines = [line for line in f if line.strip()]
    except FileNotFoundError:
        return None
    return json.loads(lines[-1]) if lines else None
