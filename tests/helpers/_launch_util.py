"""Helpers shared by the launcher tests: run the real CLI in a subprocess, on loopback only."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import ringtrain

# The ringtrain these tests imported; children must run the same one, installed or not.
RINGTRAIN_SRC = str(Path(ringtrain.__file__).resolve().parents[1])
HELPERS = str(Path(__file__).resolve().parent)  # tests/helpers: the job modules a child imports by name


# A 2-rank DDP job whose rank 1 fails at step 3 of its first attempt only (under --max-restarts 1): 50 steps.
FAILS_AT_STEP_3_ONCE = """
import os, torch, ringtrain as rt

ring = rt.Ring(strategy="ddp", seed=0)
model = torch.nn.Linear(4, 1)
model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
data = torch.utils.data.TensorDataset(torch.randn(400, 4), torch.randn(400, 1))
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
for epoch in ring.epochs(1):
    for i, (x, y) in enumerate(ring.loader(data, batch_size=4)):  # 50 steps
        if attempt == 0 and i == 3 and ring.rank == 1:
            raise ValueError("the first attempt fails at step 3")
        ring.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step(); opt.zero_grad()
"""


def _loopback_interface() -> str | None:
    names = {name for _, name in socket.if_nameindex()} if hasattr(socket, "if_nameindex") else set()
    return next((n for n in ("lo", "lo0") if n in names), None)


class _OutputTo:
    """``fn`` with the rank's stdout and stderr (file descriptors 1 and 2) sent to files in ``folder``.

    A forkserver's children write where the server was started from, not where the test is now; the test's
    process copies the files to its own output afterwards (``launch_ranks``), so capfd and a failing test's
    report see what the ranks printed."""

    def __init__(self, fn, folder: str):
        self.fn, self.folder = fn, folder

    def __call__(self, *args):
        rank = os.environ.get("RANK", "0")
        for fd, name in ((1, "out"), (2, "err")):
            target = os.open(os.path.join(self.folder, f"{rank}.{name}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(target, fd)
            os.close(target)
        return self.fn(*args)


def launch_ranks(fn, nprocs: int = 2, args=(), timeout: float = 120):
    """``ringtrain.launch`` for tests whose subject is not how processes start: the ranks are forked from one
    server that imported torch and the job modules once (conftest.py's preload), not spawned afresh (2-3 s of
    CPU each for ``import torch``). tests/launcher/test_launch_spawn.py tests the start methods themselves.
    What the ranks print reaches this process's stdout and stderr, rank by rank, once they have ended."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ringtrain-ranks-") as folder:
        try:
            return ringtrain.launch(_OutputTo(fn, folder), nprocs, args=args, timeout=timeout,
                                    start_method="forkserver")
        finally:
            for rank in range(nprocs):
                for fd, name in ((1, "out"), (2, "err")):
                    path = os.path.join(folder, f"{rank}.{name}")
                    if os.path.exists(path):
                        with open(path, "rb") as f:
                            os.write(fd, f.read())


def child_env(*pythonpath: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, HELPERS, RINGTRAIN_SRC, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # Keep Gloo's connections on loopback whatever the hostname resolves to.
    lo = _loopback_interface()
    if lo:
        env["GLOO_SOCKET_IFNAME"] = lo
    env["OMP_NUM_THREADS"] = "1"  # two cores: no oversubscription, and no torchrun banner
    env.update(extra)
    return env


def ringtrain_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "ringtrain", *args]


def run_ringtrain(*args: str, timeout: float = 90, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ringtrain_cmd(*args), capture_output=True, text=True, timeout=timeout,
        env=env or child_env(), cwd=cwd,
    )


def two_nodes(argv_of, env: dict[str, str], timeout: float = 100) -> tuple[list[int], list[tuple[str, str]], str]:
    """Two ``ringtrain run`` nodes started as from two terminals (``argv_of(node_rank)``: each one's arguments),
    waited for together: their exit codes, their (stdout, stderr), and a report of both to show on failure."""
    nodes = [subprocess.Popen(ringtrain_cmd(*argv_of(rank)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for rank in (0, 1)]
    try:
        outs = [node.communicate(timeout=timeout) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    report = "\n".join(f"node {i} exit {n.returncode}\n{o}\n{e}" for i, (n, (o, e)) in enumerate(zip(nodes, outs)))
    return [n.returncode for n in nodes], outs, report


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def results(stdout: str) -> list[dict[str, str]]:
    """Parse the `RESULT key=value ...` lines the worker scripts print, sorted by rank.

    Workers share the launcher's stdout; each writes its line with one write() call so
    lines do not interleave (print() writes the text and the newline separately).
    """
    rows = [dict(kv.split("=", 1) for kv in line.split()[1:]) for line in stdout.splitlines() if line.startswith("RESULT ")]
    return sorted(rows, key=lambda r: int(r["rank"]))


def outputs(proc: subprocess.CompletedProcess) -> str:
    return f"--- exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


# A plain torch.distributed script: init from the environment, all_reduce, report.
ALLREDUCE = r"""
    import argparse, os, sys
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--foo", type=int)
    args = parser.parse_args()  # strict: an unexpected --local-rank would kill it
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    sys.stdout.write(f"RESULT rank={dist.get_rank()} world={dist.get_world_size()} local={os.environ['LOCAL_RANK']} "
                     f"sum={t.item()} foo={args.foo} path0={sys.path[0]}\n")
    dist.destroy_process_group()
"""


# Steps of a Ring with a checkpoint_dir and no periodic save: only a preemption writes one. Rank 0 says when
# step 3 is done (a file); the test then signals the launcher, with 7 s of steps still to go.
PREEMPTIBLE = r"""
import os, sys, time
import torch
import ringtrain as rt

ring = rt.Ring(device="cpu", checkpoint_dir="ckpt", save_every=1000)
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
for step in ring.steps(150):
    ring.backward(model(torch.ones(2, 4)).sum())
    optimizer.step()
    optimizer.zero_grad()
    if ring.rank == 0 and step == 3:
        open("running", "w").close()
    time.sleep(0.05)
ring.close()
sys.stdout.write(f"RESULT rank={ring.rank} steps={ring.optimizer_steps}\n")
"""


def preempted_by(command: list[str], sig: int, cwd: Path, env: dict) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``command`` (a job of PREEMPTIBLE) in ``cwd``, send it ``sig`` once rank 0 is past step 3; the finished
    process and the seconds from the signal to its exit."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    try:
        deadline = time.monotonic() + 90
        while not (cwd / "running").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                out, err = proc.communicate()
                raise AssertionError(outputs(subprocess.CompletedProcess(command, proc.returncode, out, err)))
            time.sleep(0.1)
        signalled = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=90)
        return subprocess.CompletedProcess(command, proc.returncode, out, err), time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def preemption_problems(first: subprocess.CompletedProcess, cwd: Path, env: dict[str, str]) -> list[str]:
    """What is wrong with a preempted PREEMPTIBLE job ``first`` and the same command run again: the first must exit
    75 with one checkpoint, of one step, and the second resume from it and end both ranks at step 150 ([]: nothing)."""
    if first.returncode != 75 or "preempted: every node's ranks saved their checkpoint; exit 75" not in first.stderr:
        return [f"not preempted\n{outputs(first)}"]
    saved = sorted(p.name for p in (cwd / "ckpt").iterdir() if p.name.startswith("step-"))
    if len(saved) != 1:
        return [f"checkpoints {saved}, not one\n{outputs(first)}"]
    step = int(saved[0].split("-")[1].split(".")[0])
    second = subprocess.run(first.args, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
    problems = [] if second.returncode == 0 else [f"the rerun exited {second.returncode}"]
    if f"resumed from ckpt/{saved[0]} (step {step})" not in second.stdout:
        problems.append(f"the rerun did not resume from {saved[0]}")
    if sorted(re.findall(r"RESULT rank=(\d) steps=(\d+)", second.stdout)) != [("0", "150"), ("1", "150")]:
        problems.append("the rerun did not end both ranks at step 150")
    return [f"{p}\n{outputs(second)}" for p in problems]
