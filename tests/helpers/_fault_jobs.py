"""Jobs for tests/test_faults.py, run in real processes.

Two ways in:

* as a script, ``python _fault_jobs.py JOB [options]`` or ``ringtrain run ... _fault_jobs.py JOB``
  (``train``: the restart-and-resume job; ``ckpt-kill``: die while writing a checkpoint;
  ``soak``: many start/stop cycles of ``ringtrain.launch``);
* as functions that ``ringtrain.launch`` runs in its children (importable: tests/ is on
  sys.path through conftest.py, and a spawned child gets the parent's sys.path).

Faults are injected from the outside only, through the environment variables below or
by monkeypatching inside this (test) process; the library has no test hooks.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import socket
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import ringtrain as rt

# The restart-and-resume fault: rank KILL_RANK SIGKILLs itself right after optimizer step
# KILL_AT_STEP, once: it first creates KILL_MARKER (O_EXCL), and a restarted worker that
# finds the marker goes on.
KILL_AT_STEP = "RINGTRAIN_TEST_KILL_AT_STEP"
KILL_RANK = "RINGTRAIN_TEST_KILL_RANK"
KILL_MARKER = "RINGTRAIN_TEST_KILL_MARKER"
KILL_HOW = "RINGTRAIN_TEST_KILL_HOW"  # "signal" (SIGKILL, the default) or "raise" (a Python exception)
# Sharded checkpoints are written in the background: this many seconds of delay before each
# rank writes its shards keeps a save in flight long enough to be killed during it.
SLOW_WRITE = "RINGTRAIN_TEST_SLOW_WRITE"
# Two jobs on one folder: every rank of the first stops after optimizer step HOLD_AT_STEP (rank 0
# creates HOLD_DIR/holding) and goes on once the test creates HOLD_DIR/go.
HOLD_AT_STEP = "RINGTRAIN_TEST_HOLD_AT_STEP"
HOLD_DIR = "RINGTRAIN_TEST_HOLD_DIR"

N_SAMPLES = 40
BATCH = 4


def indexed_data(n: int = N_SAMPLES) -> TensorDataset:
    """Features, labels, and each sample's index (so a step can log what it trained on)."""
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 10, generator=g), torch.randint(0, 3, (n,), generator=g), torch.arange(n))


def dropout_model() -> nn.Module:
    # Dropout draws from the global torch RNG on every step: the resumed run matches the
    # uninterrupted one only if each rank's RNG state was restored too.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Dropout(0.25), nn.Linear(16, 3))


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().cpu().flatten() for p in model.parameters()])


class StepLog:
    """One JSON line per optimizer step this rank completed: what the final parameters saw.

    Opened right after ``ring.setup``, which resumed from the newest complete checkpoint
    (``ring.optimizer_steps`` is then the checkpoint's step; 0 on a fresh start). Lines
    for later steps were written by an attempt that died before its next checkpoint:
    their effect was lost with it and those steps are trained again, so they are
    dropped. The file is rewritten atomically, so a crash here cannot corrupt it either.
    A line is written (one write, flushed to the kernel) right after its step and
    before the next batch is asked for, which is when the ring saves a checkpoint of
    that step: every step a checkpoint holds is already in the log.
    """

    def __init__(self, path: str, resumed_step: int):
        kept = []
        if os.path.exists(path):
            with open(path) as f:
                kept = [line for line in f if line.strip() and json.loads(line)["step"] <= resumed_step]
        with open(path + ".tmp", "w") as f:
            f.writelines(kept)
        os.replace(path + ".tmp", path)
        self.file = open(path, "a")  # noqa: SIM115 - open for the whole run, closed at exit

    def record(self, **row) -> None:
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    @staticmethod
    def read(path: str) -> list[dict]:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]


def _maybe_die(rank: int, step: int) -> None:
    if os.environ.get(KILL_AT_STEP) != str(step) or os.environ.get(KILL_RANK, "1") != str(rank):
        return
    try:
        os.close(os.open(os.environ[KILL_MARKER], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return  # this fault already happened once: the restarted worker goes on
    if os.environ.get(KILL_HOW) == "raise":
        raise RuntimeError(f"rank {rank} fails on purpose after step {step}")
    os.kill(os.getpid(), signal.SIGKILL)


def _maybe_hold(rank: int, step: int) -> None:
    if os.environ.get(HOLD_AT_STEP) != str(step):
        return
    folder = os.environ[HOLD_DIR]
    if rank == 0:
        open(os.path.join(folder, "holding"), "w").close()
    deadline = time.monotonic() + 150
    while not os.path.exists(os.path.join(folder, "go")):  # the test's event, polled
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank {rank}: nobody created {folder}/go")
        time.sleep(0.05)


def train_command(folder, *options: str) -> list[str]:
    """``ringtrain run --nproc-per-node 2 --max-restarts 1 _fault_jobs.py train [options]`` into ``folder``."""
    from _launch_util import ringtrain_cmd

    return ringtrain_cmd("run", "--nproc-per-node", "2", "--max-restarts", "1", os.path.abspath(__file__), "train",
                         *options, "--ckpt", str(folder / "ckpt"), "--log", str(folder / "log"),
                         "--out", str(folder / "params.pt"))


def run_train(folder, *options: str, **fault: str):
    """From a test: ``train_command`` run into ``folder`` (its ckpt/, log/ and params.pt), faults given as
    environment variables; (the finished process, those paths)."""
    import subprocess

    from _launch_util import child_env

    paths = train_paths(folder)
    proc = subprocess.run(train_command(folder, *options), capture_output=True, text=True, timeout=200,
                          env=child_env(**fault))
    return proc, paths


def train_paths(folder) -> dict:
    """``folder``'s ckpt/ and log/ (made here) and params.pt, as ``train_command`` uses them."""
    paths = {name: folder / name for name in ("ckpt", "log")}
    for path in paths.values():
        path.mkdir(parents=True)
    paths["out"] = folder / "params.pt"
    return paths


def _slow_writes(seconds: float) -> None:
    """Every rank waits ``seconds`` before writing its shards (DCP's FileSystemWriter.write_data)."""
    from torch.distributed.checkpoint import FileSystemWriter

    write = FileSystemWriter.write_data

    def slow(self, *args, **kwargs):
        time.sleep(seconds)
        return write(self, *args, **kwargs)

    FileSystemWriter.write_data = slow


def train_main(args: argparse.Namespace) -> None:
    """The restart-and-resume job: DDP (or FSDP: sharded, asynchronous checkpoints) with periodic
    checkpoints, logging every step's samples."""
    if os.environ.get(SLOW_WRITE):
        _slow_writes(float(os.environ[SLOW_WRITE]))
    strategy = args.strategy
    if args.powersgd:  # gradient compression whose state (error feedback, Q) a resume must restore
        strategy = rt.strategies.DDP(compression=rt.strategies.PowerSGD(rank=args.powersgd))
    ring = rt.Ring(strategy=strategy, seed=0, checkpoint_dir=args.ckpt, save_every=args.save_every, keep_last=2)
    model = dropout_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer = ring.setup(model, optimizer)  # resumes here after a restart
    loader = ring.loader(indexed_data(), batch_size=BATCH, shuffle=True)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log = StepLog(os.path.join(args.log, f"rank{ring.rank}.jsonl"), ring.optimizer_steps)
    for epoch in ring.epochs(args.epochs):
        for x, y, idx in loader:
            ring.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            log.record(step=ring.optimizer_steps, epoch=epoch, idx=idx.tolist(), attempt=attempt)
            _maybe_die(ring.rank, ring.optimizer_steps)
            _maybe_hold(ring.rank, ring.optimizer_steps)
    whole = ring.strategy.module_state(model)  # the unsharded state on rank 0 (collective under FSDP)
    if ring.is_main:
        torch.save(torch.cat([v.flatten() for v in whole.values()]), args.out)
    sys.stdout.write(f"RESULT rank={ring.rank} attempt={attempt} steps={ring.optimizer_steps}\n")
    ring.close()


# --- dying while a checkpoint is written ---------------------------------------------

CKPT_EVERY = 2
CKPT_STEPS = 8  # 2 epochs of 4 steps (16 samples, batch 4)


def checkpointed_run(folder: str, keep_last: int = 2, on_step=None) -> torch.Tensor:
    """One process, checkpoints every CKPT_EVERY steps into ``folder`` (resuming from it)."""
    ring = rt.Ring(seed=0, checkpoint_dir=folder, save_every=CKPT_EVERY, keep_last=keep_last)
    model = dropout_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = ring.setup(model, optimizer)
    loader = ring.loader(indexed_data(16), batch_size=BATCH, shuffle=True)
    for _ in ring.epochs(CKPT_STEPS * BATCH // 16):
        for x, y, _idx in loader:
            if on_step is not None:
                on_step(ring.optimizer_steps)
            ring.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    ring.close()
    return flat_params(model)


def _die(*_args, **_kwargs):
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(point: str) -> None:
    """Make the next checkpoint write SIGKILL this process at ``point`` (monkeypatching, test only)."""
    from ringtrain.checkpoint.folder import CheckpointDir

    real_save, real_replace, real_unlink = torch.save, os.replace, os.unlink
    if point == "temp-partial":
        def save(obj, f, *args, **kwargs):  # half the bytes reach the temporary file, then death
            buffer = io.BytesIO()
            real_save(obj, buffer, *args, **kwargs)
            f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
            f.flush()
            os.fsync(f.fileno())
            _die()
        torch.save = save
    elif point in ("temp-complete", "manifest-temp"):
        target = ".pt" if point == "temp-complete" else CheckpointDir.MANIFEST
        def replace(src, dst, *args, **kwargs):  # the temporary file is whole; the rename never happens
            if os.fspath(dst).endswith(target):
                _die()
            return real_replace(src, dst, *args, **kwargs)
        os.replace = replace
    elif point == "renamed":
        CheckpointDir.commit = _die  # the file has its final name; the manifest lists it not
    elif point == "pruning":
        def unlink(path, *args, **kwargs):  # the manifest is updated; the oldest file is still there
            if os.path.basename(os.fspath(path)).startswith("step-"):
                _die()
            return real_unlink(path, *args, **kwargs)
        os.unlink = unlink
    else:
        raise ValueError(point)


def ckpt_kill_main(args: argparse.Namespace) -> None:
    armed = []

    def on_step(step: int) -> None:
        # The checkpoint of step KILL_AFTER - 1 is committed by now (it is written when this
        # batch is asked for); arm the fault for the next one.
        if step == args.arm_at and not armed:
            armed.append(True)
            _arm(args.point)

    checkpointed_run(args.folder, keep_last=args.keep_last, on_step=on_step)
    print("finished without dying", flush=True)


def user_save_kill_main(args: argparse.Namespace) -> None:
    """The user's own ``ring.save(path)``, SIGKILLed halfway through writing its temporary file; with
    ``--sharded``, ``ring.save(path, full=False)`` SIGKILLed once its shards are in the staging folder
    (before that folder is put in place)."""
    from ringtrain.checkpoint import sharded

    ring = rt.Ring(seed=0)
    model = ring.setup(dropout_model())
    if args.sharded:
        real_write = sharded.write_shards
        def write_shards(folder, *a, **kw):
            real_write(folder, *a, **kw)
            _die()
        sharded.write_shards = write_shards
    else:
        _arm("temp-partial")
    ring.save(args.path, model=model, full=not args.sharded)
    print("finished without dying", flush=True)


def manifest_full_main(args: argparse.Namespace) -> None:
    """The disk is full exactly when step 4's manifest is written: the file system refuses the manifest's
    temporary file (ENOSPC from fsync, at the OS call); everything before it went through."""
    import errno

    real_fsync = os.fsync

    def fsync(fd):
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name.startswith(".manifest.json.") and name.endswith(".tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    def on_step(step: int) -> None:
        if step == CKPT_EVERY + 1:  # step 2's checkpoint and manifest are written; step 4's meet the full disk
            os.fsync = fsync

    try:
        checkpointed_run(args.folder, on_step=on_step)
    except rt.RingtrainError as e:
        print(f"ERROR {type(e).__name__}: {e}", flush=True)
        sys.exit(3)
    print("finished without an error", flush=True)


# --- functions for ringtrain.launch -------------------------------------------------

def one_all_reduce(cycle: int) -> float:
    """The soak's unit of work: join the group, one all_reduce, leave."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + cycle)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


def exact_uneven(n: int, batch: int) -> dict:
    """Evaluate with an exact loader whose ranks get different numbers of batches, then gather."""
    ring = rt.Ring(seed=0)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    model = ring.setup(net)
    data = TensorDataset(torch.linspace(-1, 1, n * 3).view(n, 3), torch.arange(n))
    loader = ring.loader(data, batch_size=batch, exact=True)
    model.eval()
    outs, idxs, batches = [], [], 0
    with torch.no_grad():
        for x, i in loader:  # the DDP-wrapped model, as an evaluation loop would use it
            outs.append(model(x))
            idxs.append(i)
            batches += 1
        out = {
            "batches": batches,
            "index": ring.all_gather(torch.cat(idxs)),
            "output": ring.all_gather(torch.cat(outs)),
            "expected": net(data.tensors[0]),
        }
    ring.close()
    return out


def blocked_in_recv(pid_dir: str) -> None:
    """Both ranks wait, inside C++, for a message the other never sends (until killed)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    with open(os.path.join(pid_dir, f"{dist.get_rank()}.pid"), "w") as f:
        f.write(str(os.getpid()))
    # SIGINT (torch's own parent-death signal for spawned children) cannot interrupt this.
    dist.recv(torch.zeros(1), src=1 - dist.get_rank())


# --- process and socket accounting (Linux /proc) ---------------------------------------

def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (children, grandchildren, ...)."""
    parent_of = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
                    parent_of[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass  # gone meanwhile
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parent_of.items() if ppid in frontier} - found
        found |= frontier
    return found


def socket_inodes(pids) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            pass  # exited meanwhile, or not ours to read
    return inodes


def _decode_addr(hex_addr: str) -> str:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        address = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # four little-endian 32-bit words
        address = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
    return f"{address}:{int(port, 16)}"


def listening(inodes: set[str]) -> list[str]:
    """``address:port`` of every TCP socket in LISTEN state among ``inodes``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A = TCP_LISTEN
                found.append(_decode_addr(fields[1]))
    return sorted(found)


def soak_main(args: argparse.Namespace) -> None:
    """``args.cycles`` start/stop cycles of a 2-rank ringtrain.launch group; print what leaked.

    Children come from a forkserver that imported torch once, so a cycle costs an
    init_process_group, not two torch imports; the forkserver (and multiprocessing's
    resource tracker) are started by a warm-up cycle, before the baseline is taken.
    """
    import multiprocessing

    import _fault_jobs as jobs  # by module name, so children find the function

    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "ringtrain", "_fault_jobs"])
    me = os.getpid()

    def snapshot() -> dict:
        below = descendants(me)
        return {"children": sorted(below), "listening": listening(socket_inodes(below | {me})),
                "fds": len(os.listdir("/proc/self/fd"))}

    def cycle(i: int) -> None:
        out = rt.launch(jobs.one_all_reduce, 2, args=(i,), start_method="forkserver", timeout=60)
        assert out == [2.0 * i + 1] * 2, out

    cycle(0)
    before = snapshot()
    # The accounting sees a listener when there is one (the store's, during a cycle).
    from ringtrain.launcher.ports import bind_listener

    with bind_listener("127.0.0.1", 0):
        probe = snapshot()["listening"]
    start = time.monotonic()
    for i in range(1, args.cycles + 1):
        cycle(i)
    elapsed = time.monotonic() - start
    after = snapshot()
    print("SOAK " + json.dumps({"before": before, "after": after, "probe": probe, "seconds": elapsed,
                                "cycles": args.cycles}), flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="_fault_jobs.py")
    jobs = parser.add_subparsers(dest="job", required=True)
    train = jobs.add_parser("train")
    train.add_argument("--ckpt", required=True)
    train.add_argument("--log", required=True)
    train.add_argument("--out", required=True)
    train.add_argument("--epochs", type=int, default=3)
    train.add_argument("--save-every", type=int, default=3)
    train.add_argument("--strategy", default="auto")
    train.add_argument("--lr", type=float, default=0.1)
    train.add_argument("--powersgd", type=int, default=0, help="DDP with PowerSGD of this rank")
    kill = jobs.add_parser("ckpt-kill")
    kill.add_argument("--folder", required=True)
    kill.add_argument("--point", required=True)
    kill.add_argument("--arm-at", type=int, default=CKPT_EVERY + 1)
    kill.add_argument("--keep-last", type=int, default=2)
    user_save = jobs.add_parser("user-save-kill")
    user_save.add_argument("--path", required=True)
    user_save.add_argument("--sharded", action="store_true")
    full = jobs.add_parser("manifest-full")
    full.add_argument("--folder", required=True)
    soak = jobs.add_parser("soak")
    soak.add_argument("--cycles", type=int, default=50)
    args = parser.parse_args(argv)
    {"train": train_main, "ckpt-kill": ckpt_kill_main, "soak": soak_main, "user-save-kill": user_save_kill_main,
     "manifest-full": manifest_full_main}[args.job](args)


if __name__ == "__main__":
    main(sys.argv[1:])
