"""ringtrain bench: the tutorials' DP/DDP/AMP comparison table, measured on this machine.

Usage:
    ringtrain bench --quick                                   # < 3 min on a 2-core CPU: digits, every mode
    ringtrain bench --workload mlp --nprocs 1,2 --steps 30
    ringtrain bench --workload cifar-resnet18 --quick         # minutes on a 2-core CPU: a smaller ResNet
    ringtrain bench --workload cifar-resnet18 --precision 32,bf16-mixed --epochs 1   # hours on a CPU: for GPUs
    ringtrain bench --workload cifar-resnet18 --data ~/data/cifar-100-python
    ringtrain bench --modes ddp,raw-ddp --repeats 7            # ringtrain's overhead vs the tutorial loop
    ringtrain bench --workload mlp --modes ddp,fsdp --nprocs 2  # sharded vs replicated: speed and peak memory
    ringtrain bench --preset gpu [--compile] [--nprocs 1,8]    # CIFAR ResNet-18 images/s and MFU on GPUs
    ringtrain bench --workload cifar-resnet18 --sync-bn --modes dp,ddp --precision 32,16-mixed   # seed 004's table
    ringtrain bench --comm                                    # all-reduce bus bandwidth by message size
    ringtrain bench --comm --link 1gbit                       # ... through a 1 Gbit/s full-duplex link (root)
    ringtrain bench --workload mlp --modes ddp,hvd --device cpu --link 1gbit   # the training table on a slow link

Workloads (nothing is downloaded): digits-cnn (scikit-learn's real digits; held-out
accuracy), cifar-resnet18 (CIFAR-100-shaped synthetic images, or the real set with
--data), mlp (a few million parameters, communication-bound), unet3d (3D U-Net
segmenting synthetic volumes; Dice).

Modes: single, dp (one process driving >= 2 GPUs), ddp, ddp+accumulate (accumulate=k,
micro-batch = batch / k), ddp+ac (activation checkpointing of the repeated blocks: less
memory, more compute), fsdp (sharded: each rank holds 1/W of the weights, gradients
and optimizer state; compare its peak memory with ddp's), tp (tensor parallel over pairs of
ranks, DDP(tp=2); even process counts), hvd, hvd+fp16 (Horovod-style optimizer, fp16 gradient
compression), pipeline (2 stages x 4 micro-batches), raw-ddp (the hand-written tutorial
DDP loop: the baseline for ringtrain's overhead); ddp+bf16, ddp+powersgd, ddp+auto (DDP's
gradients all-reduced as bfloat16, as PowerSGD rank-8 factors, or as compression="auto" picks
after measuring the link) run only when --modes names them. The comm/step column is the bytes
each rank all-reduces per optimizer step. A mode that cannot run here is listed
as SKIPPED with the reason; one that crashes as FAILED with its error.

How long: on a CPU the bench times one optimizer step of the workload's model before anything starts and
says about how long its runs will take ("about 3 min"); past 10 minutes it adds the --quick form's time and
the flags that shorten it (bench/estimate.py), then starts. Ctrl-C stops it.

Every mode trains the same global batch per optimizer step (--batch-size) and the same
number of samples; warm-up steps are not timed; each figure is the median of --repeats
runs taken in alternating order. Columns and method: docs/bench.md.

--sync-bn: SyncBatchNorm in every mode, as in seed 004's timings (Ring(sync_batchnorm=True);
raw-ddp converts with nn.SyncBatchNorm.convert_sync_batchnorm, or on CPU/Gloo, where torch's
refuses CPU tensors, with ringtrain's SyncBatchNorm). Batch statistics then cover the global
batch, so ddp on W processes trains the model single trains. For workloads with BatchNorm
(cifar-resnet18, unet3d); dp and pipeline cannot synchronise BatchNorm and are SKIPPED.

--comm: instead of the training table, all-reduce bus bandwidth by message size (64 KiB to
64 MiB, float32, Gloo; --nprocs default 2): time, algbw = bytes/time and busbw = algbw x
2(n-1)/n (nccl-tests' definitions), and with --link the share of the link's rate busbw reaches.

--link RATE[,DELAY] (e.g. 1gbit, 100mbit, 10gbit,0.2ms; tc's units): the ranks run in a
private network namespace (127.0.0.1 only) whose loopback is shaped with tc: RATE for each
direction of each connection (a full-duplex link, as a NIC is), DELAY added one way (netem).
The namespace is deleted when the bench ends, however it ends. Needs root and iproute2 (ip,
tc); CPU ranks only (NCCL between GPUs of one machine never touches the loopback).
ringtrain/bench/netlink.py says how the shaping works.

Output: the full table on stdout, then the same results in seed 004's shape (model, dataset,
training method, time in s/epoch, accuracy or Dice); results.csv, results.json and
throughput.png in --out.

Environment variables: none are read by the bench itself; CUDA_VISIBLE_DEVICES limits
the GPUs it sees, as always.

Failure modes:
    exit 0   every requested mode ran or was skipped with a reason
    exit 1   some mode failed (its row says why); the other results are still written
    exit 2   bad arguments, or the bench could not start (the message ends with a HINT)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from ..errors import RingtrainError, missing_extra
from .names import COMPRESSED, EXTRA, MODES, WITH_BATCHNORM, WORKLOADS

PRECISIONS = ("32", "bf16-mixed", "16-mixed")
# CPUs have no float16 arithmetic: torch emulates it, 10-30x slower than fp32 (measured here), so
# 16-mixed on a CPU checks the fp16 code path (GradScaler("cpu")) but says nothing about speed. It
# runs when asked for (--precision 16-mixed) and is left out of the CPU default.
FULL = {"precision": None, "nprocs": "1,2", "repeats": 5, "warmup": 3, "epochs": 1}
QUICK = {"precision": "32,bf16-mixed", "nprocs": "1,2", "repeats": 3, "warmup": 2, "epochs": 2}
GPU = {"precision": "32,bf16-mixed,16-mixed", "nprocs": "1", "repeats": 3, "warmup": 15, "batch_size": 512}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's errors end with a HINT too (docs/architecture.md, principle 4)
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\nHINT: see `{self.prog} --help`.\n")


def _add(parser: argparse.ArgumentParser, flag: str, **kw) -> None:
    """``--batch-size`` also accepts ``--batch_size``, like torchrun; the alias stays out of --help."""
    parser.add_argument(flag, **kw)
    if flag.count("-") > 2:
        dest = flag[2:].replace("-", "_")
        alias = {k: v for k, v in kw.items() if k in ("type", "action", "choices")}
        parser.add_argument("--" + dest, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **alias)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ringtrain bench", description=__doc__, allow_abbrev=False,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    _add(p, "--workload", default="digits-cnn", choices=WORKLOADS)
    _add(p, "--modes", default=",".join(m for m in MODES if m not in COMPRESSED),
         help="comma-separated (default: all but the ddp+compression ones, which matter on a slow link: --link)")
    _add(p, "--precision", help="comma-separated among 32, bf16-mixed, 16-mixed (default: all three on GPUs, "
                                  "32,bf16-mixed on CPUs, where fp16 is emulated and 10-30x slower)")
    _add(p, "--nprocs", help="comma-separated process counts (default 1,2)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=int, help="timed epochs per run (default 1; --quick 2)")
    length.add_argument("--steps", type=int, help="timed optimizer steps per run, instead of --epochs")
    _add(p, "--batch-size", type=int, help="global batch per optimizer step, the same in every mode "
                                           "(default: the workload's; --preset gpu: per GPU, 512)")
    _add(p, "--accumulate", type=int, default=4, help="k for ddp+accumulate (default 4)")
    _add(p, "--sync-bn", action="store_true", help="SyncBatchNorm in every mode, as seed 004's timings "
                                                   "(workloads with BatchNorm: cifar-resnet18, unet3d)")
    _add(p, "--repeats", type=int, help="runs per measurement (default 5; --quick 3)")
    _add(p, "--warmup", type=int, help="untimed optimizer steps per run (default 3; --quick 2)")
    _add(p, "--width", type=int, help="model width: channels (CNNs), hidden size (mlp), base channels (unet3d)")
    _add(p, "--samples", type=int, help="training samples (synthetic sets: how many to make)")
    _add(p, "--out", default="bench-results", help="folder for results.csv/json and the plot (default bench-results)")
    _add(p, "--quick", action="store_true", help="small sizes and few repeats: under 3 minutes on a 2-core CPU")
    _add(p, "--data", help="the cifar-100-python folder for --workload cifar-resnet18 (default: synthetic)")
    _add(p, "--device", default="auto", choices=("auto", "cpu", "cuda"))
    _add(p, "--threads-per-rank", type=int, default=1, help="torch threads per process on CPU (default 1)")
    _add(p, "--timeout", type=float, default=1800.0, help="seconds one launch of processes may take (default 1800)")
    _add(p, "--no-progress", action="store_true", help="no progress bar")
    _add(p, "--comm", action="store_true", help="all-reduce bus bandwidth by message size instead of training")
    _add(p, "--link", metavar="RATE[,DELAY]", help="run the ranks behind a shaped loopback: RATE per direction "
                                                   "(tc units: 1gbit, 100mbit), optional one-way DELAY (0.2ms); root")
    _add(p, "--preset", choices=("gpu",), help="gpu: CIFAR ResNet-18 images/s and MFU on CUDA GPUs")
    _add(p, "--compile", action="store_true", help="--preset gpu: also torch.compile the channels_last variants")
    _add(p, "--peak-tflops", type=float, help="--preset gpu: the GPU's dense bf16 peak, when not in the table")
    return p


def _list(value: str, what: str, allowed=None, cast=str) -> list:
    try:
        items = [cast(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError as e:
        raise RingtrainError(f"--{what} {value!r} is not a comma-separated list of numbers", "e.g. --nprocs 1,2.") from e
    bad = [v for v in items if allowed is not None and v not in allowed]
    if bad or not items:
        raise RingtrainError(f"--{what} {value!r}: unknown {bad or 'empty list'}", f"choose among {', '.join(map(str, allowed))}.")
    return list(dict.fromkeys(items))


def _positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise RingtrainError(f"--{name.replace('_', '-')} {value}", "give a positive number.")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return _main(args)
    except RingtrainError as e:
        print(f"ringtrain bench: {e}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    _positive(args, "epochs", "steps", "batch_size", "accumulate", "repeats", "warmup", "width", "samples",
              "threads_per_rank")
    defaults = GPU if args.preset == "gpu" else QUICK if args.quick else FULL
    if args.link is not None:
        from .netlink import parse_link  # --link only

        parse_link(args.link)  # a bad value is an error before anything starts
        if args.preset == "gpu" or args.device == "cuda":
            raise RingtrainError(f"--link with {'--preset gpu' if args.preset else '--device cuda'}",
                                 "NCCL between the GPUs of one machine goes over NVLink, PCIe or shared memory, not "
                                 "the loopback --link shapes: use --link with CPU ranks (--device cpu).")
    if args.comm:
        return _comm(args, defaults)
    # What the command line alone decides is checked before torch loads (seconds on a loaded machine).
    if args.data is not None:
        if args.preset is None and args.workload != "cifar-resnet18":
            raise RingtrainError(f"--data was given for --workload {args.workload}",
                                 "--data is the cifar-100-python folder for --workload cifar-resnet18 (and --preset "
                                 "gpu); the other workloads bring their own data.")
        if not os.path.isfile(os.path.join(args.data, "train")):
            raise RingtrainError(f"--data {args.data!r} has no CIFAR-100 'train' file",
                                 "point --data at the extracted 'cifar-100-python' folder (it holds 'train' and "
                                 "'test'); nothing is downloaded.")
    if args.preset == "gpu" and args.sync_bn:
        raise RingtrainError("--sync-bn with --preset gpu", "the GPU preset measures one process per GPU "
                             "configuration without it; drop --sync-bn, or use --workload cifar-resnet18 --sync-bn.")
    if args.preset is None and args.sync_bn and args.workload not in WITH_BATCHNORM:
        raise RingtrainError(f"--sync-bn with --workload {args.workload}: its model has no BatchNorm layer, so there "
                             "is nothing to synchronise",
                             f"use a workload with BatchNorm ({', '.join(WITH_BATCHNORM)}; cifar-resnet18 is seed "
                             "004's ResNet-18), or drop --sync-bn.")
    modes = _list(args.modes, "modes", MODES)
    if args.precision is not None:
        _list(args.precision, "precision", PRECISIONS)
    nprocs = _list(args.nprocs or defaults["nprocs"], "nprocs", cast=int)
    if min(nprocs) < 1:
        raise RingtrainError(f"--nprocs {args.nprocs}", "process counts are positive, e.g. --nprocs 1,2.")
    if args.preset is None and args.workload == "digits-cnn":
        lacking = missing_extra("sklearn", EXTRA, "--workload digits-cnn (scikit-learn's real digits)")
        if lacking is not None:
            raise lacking
    picture = missing_extra("matplotlib", EXTRA, "throughput.png")
    if picture is not None:  # said now, not after the runs: the rest of the results do not need it
        print(f"ringtrain bench: {picture.message}: the tables, results.csv and results.json come without it\n"
              f"HINT: {picture.hint}", file=sys.stderr, flush=True)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise RingtrainError("--device cuda was asked for, but torch sees no CUDA device", "use --device auto or cpu.")
    gpus = args.device != "cpu" and torch.cuda.is_available()
    if args.link is not None and gpus:
        raise RingtrainError("--link on a machine with GPUs: the bench would train its ranks on them with NCCL, "
                             "which does not go through the loopback --link shapes", "add --device cpu.")
    default_precision = defaults["precision"] or ("32,bf16-mixed,16-mixed" if gpus else "32,bf16-mixed")
    precisions = _list(args.precision or default_precision, "precision", PRECISIONS)
    repeats = args.repeats or defaults["repeats"]
    warmup = args.warmup if args.warmup is not None else defaults["warmup"]
    if args.preset == "gpu":
        return _gpu(args, precisions, nprocs, repeats, warmup, picture is None)
    # the measuring modules import torch and matplotlib: --help and argument errors answer before them
    from . import plot, report, runner, stats

    cfg = runner.Config(
        workload=args.workload, modes=modes, precisions=precisions, nprocs=nprocs,
        epochs=None if args.steps else (args.epochs or defaults["epochs"]), steps=args.steps, batch_size=args.batch_size,
        accumulate=args.accumulate, repeats=repeats, warmup=warmup, quick=args.quick, width=args.width,
        samples=args.samples, data=args.data, device=args.device, threads=args.threads_per_rank,
        timeout=args.timeout, progress=not args.no_progress, sync_bn=args.sync_bn,
    )
    if not gpus:
        _say_how_long(cfg)
    from .netlink import inside  # --link shapes a private network namespace (Linux, root) only when given

    with tempfile.TemporaryDirectory(prefix="ringtrain-bench-") as scratch, inside(args.link):
        result = runner.run(cfg, scratch)
    result["meta"]["link"] = args.link
    rows = stats.summarize(result["records"], cfg.precisions)
    meta = result["meta"]
    print(report.table(rows, meta), flush=True)
    print("\n" + report.seed_table(rows, meta), flush=True)
    paths = report.write_all(rows, meta, result["records"], args.out)
    if picture is None:
        paths.append(plot.throughput_png(rows, meta, f"{args.out}/throughput.png"))
    print(f"\nwrote {', '.join(paths)}")
    return 1 if any(r["status"] == "failed" for r in rows) else 0


def _estimate(cfg) -> tuple[float, int, int, int]:
    """(seconds, runs, optimizer steps per run, global batch) of the bench ``cfg`` on this machine's CPU (bench/estimate.py)."""
    import torch

    from ..launcher.env_info import usable_cpus  # the cores the ranks share (torch-free; here with the rest)
    from . import estimate, runner  # torch: only for a bench that is about to run
    from .modes import precision_problem  # torch, as above

    wl = cfg.build_workload()
    launches, _ = runner.plan(cfg)
    timed = cfg.steps or cfg.epochs * (len(wl.train) // wl.global_batch)
    precisions = [p for p in cfg.precisions if not precision_problem(p, torch.device("cpu"))]
    per_sample = {p: estimate.seconds_per_sample(wl, p, cfg.threads) for p in precisions}
    seconds = estimate.total_seconds(wl, launches, precisions, cfg.repeats, cfg.warmup, timed, per_sample,
                                     usable_cpus())
    runs = sum(len(modes) for modes in launches.values()) * len(precisions) * cfg.repeats
    return seconds, runs, cfg.warmup + timed, wl.global_batch


def _say_how_long(cfg) -> None:
    """Before the first process starts: about how long this bench takes here, and its quick form when long."""
    import dataclasses

    from . import estimate  # torch: only for a bench that is about to run

    seconds, runs, steps, batch = _estimate(cfg)
    said = (f"ringtrain bench: {runs} runs of {steps} optimizer steps (global batch {batch}): "
            f"{estimate.words(seconds)} on this machine, going by one step timed here.")
    if seconds < estimate.LONG_S:
        print(said, file=sys.stderr, flush=True)
        return
    if cfg.quick:
        hint = "fewer --modes, --nprocs or --repeats, or --steps N, make it shorter."
    else:
        # the command the HINT gives: QUICK's sizes, every default mode
        quick = _estimate(dataclasses.replace(
            cfg, quick=True, epochs=QUICK["epochs"], repeats=QUICK["repeats"], warmup=QUICK["warmup"],
            precisions=_list(QUICK["precision"], "precision", PRECISIONS), nprocs=_list(QUICK["nprocs"], "nprocs", cast=int),
            modes=[m for m in MODES if m not in COMPRESSED], width=None, samples=None, batch_size=None, steps=None))[0]
        hint = (f"for a first look, `ringtrain bench --workload {cfg.workload} --quick` takes "
                f"{estimate.words(quick)} here (a smaller model and data set, fewer repeats); or fewer --modes, "
                "--nprocs or --repeats, or --steps N.")
    print(f"{said} It starts now (Ctrl-C stops it).\nHINT: {hint}", file=sys.stderr, flush=True)


def _gpu(args: argparse.Namespace, precisions: list[str], nprocs: list[int], repeats: int, warmup: int,
         picture: bool) -> int:
    from . import gpu, report  # torch and CUDA: only for --preset gpu

    gpu.require_cuda()  # before anything else: the clear error on a machine without CUDA
    opts = {"precisions": precisions, "nprocs": nprocs, "repeats": repeats, "warmup": warmup,
            "batch_size": args.batch_size or GPU["batch_size"], "steps": args.steps, "compile": args.compile,
            "data": args.data, "peak_tflops": args.peak_tflops, "timeout": args.timeout}
    rows, meta = gpu.run_preset(opts)
    print(gpu.preset_table(rows, meta), flush=True)
    paths = report.write_all(rows, meta, [], args.out, columns=list(rows[0]) if rows else [])
    if picture:
        paths.append(gpu.preset_png(rows, meta, f"{args.out}/throughput.png"))
    print(f"\nwrote {', '.join(paths)}")
    return 1 if any(r["images_per_s"] is None and not str(r["error"]).startswith("SKIPPED") for r in rows) else 0


def _comm(args: argparse.Namespace, defaults: dict) -> int:
    if args.preset is not None:
        raise RingtrainError("--comm with --preset gpu", "--comm measures Gloo all-reduce on CPU ranks; drop --preset.")
    nprocs = _list(args.nprocs or "2", "nprocs", cast=int)
    if min(nprocs) < 2:
        raise RingtrainError(f"--nprocs {args.nprocs} with --comm", "an all-reduce needs at least 2 processes.")
    from . import comm, report  # torch: only for --comm, once its arguments are known to be good

    rows, meta = comm.run(nprocs, comm.QUICK_SIZES if args.quick else comm.SIZES,
                          args.warmup if args.warmup is not None else 2, 0.25 if args.quick else 1.0,
                          args.threads_per_rank, args.timeout, args.link)
    print(comm.table(rows, meta), flush=True)
    paths = report.write_all(rows, meta, [], args.out, columns=comm.COLUMNS)
    print(f"\nwrote {', '.join(paths)}")
    return 0
