"""Functions `ringtrain.launch` runs in child processes; importable, so "spawn" can pickle them."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def all_reduce_rank(scale: float) -> dict:
    """Join the job the way torchrun workers do, all_reduce, and report what this rank saw."""
    from ringtrain.parallel.environments import detect

    env = detect()
    dist.init_process_group("gloo")  # env:// from the variables launch() sets
    t = torch.tensor([scale * (dist.get_rank() + 1)])
    dist.all_reduce(t)
    out = {
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "sum": t.item(),
        "env": (env.name, env.rank, env.local_rank, env.world_size, env.local_world_size, env.node_rank),
        "pid": os.getpid(),
    }
    dist.destroy_process_group()
    return out


def fail_on_rank_one() -> None:
    if int(os.environ["RANK"]) == 1:
        raise ValueError("boom from rank one")
    time.sleep(60)  # rank 0 must be stopped by the launcher, not finish on its own


def hang(pid_dir: str) -> None:
    with open(os.path.join(pid_dir, f"{os.environ['RANK']}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


def main_worker(local_rank: int, nprocs: int, args: dict) -> tuple:
    """mp.spawn's shape (seed 004): the index first, then the args; a Ring with no arguments."""
    import torch

    import ringtrain as rt

    ring = rt.Ring(device="cpu")
    mean = ring.all_reduce(torch.tensor([float(local_rank) * 2]), op="mean").item()
    return (local_rank, nprocs, ring.world_size, mean, args["lr"])


def tcp_worker(local_rank: int, nprocs: int, port: int) -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=nprocs, rank=local_rank)
    t = torch.tensor([float(local_rank + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


def _claim_or_fail(path: str) -> str:
    """Unpickled in a child before fn runs: the first child to get here dies of a Python error."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return path
    raise ImportError("this child could not load its arguments (on purpose)")


class FailsInOneChildsStart:
    """An argument one child cannot unpickle: that child dies of a Python error before fn (and its
    error record) starts, as a child of a script fed on stdin did; the other runs fn."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (_claim_or_fail, (self.path,))


def sleep_a_minute(_claim: str) -> None:
    time.sleep(60)  # stopped by the launcher once the other child failed


def env_worker_that_destroys(local_rank: int, nprocs: int) -> float:
    """pytorch/examples' shape: env:// (MASTER_ADDR/PORT from the launcher), destroy_process_group at the end."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", world_size=nprocs, rank=local_rank)
    t = torch.tensor([float(local_rank + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()
