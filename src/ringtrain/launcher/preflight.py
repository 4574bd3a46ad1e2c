"""Checks of a valid plan against this machine, before anything starts.

``plan_from_args`` checks the command line by itself; what it cannot know is the machine
it runs on. A ``--master-addr`` on node 0 that is not one of this machine's addresses used
to reach the store's C++ client, which tried to connect to the other machine for
``--timeout`` seconds and then printed a C++ stack; a node 0 that cannot hold one open
file per peer connection waited for nodes whose connections it would refuse; nine workers
on two cores started without a word. Here:

* ``master_is_here`` — node 0 of a fixed-size job hosts the store at ``--master-addr``,
  so the address must be this machine's (a bind test: ports.is_this_machine).
* ``store_fits`` — node 0's store holds a connection per node's agent (two: the
  rendezvous and its counter, rendezvous.py) and per worker, each an open file: more than
  ``ulimit -n`` allows cannot form.
* ``oversubscription`` — a warning, not an error: more than ``OVERSUBSCRIBED`` workers per
  usable CPU core (or per visible GPU) is allowed, but every step then waits for the
  slowest of processes that take turns on a core.
* ``threads_per_worker`` — ``OMP_NUM_THREADS`` for the workers when it is unset: the usable cores
  shared by every rank this machine runs. torchrun sets 1 for more than one worker per node (and
  prints four lines saying so), and nothing for one: two one-worker "nodes" on one 2-core machine
  (docs/launching.md's recipe) then ran 4 threads on 2 cores, 233 ms a step against 19 ms with 1 thread.

Only the ``env_info`` functions look at the machine; tests replace them to play another one.
"""

from __future__ import annotations

import socket
from typing import Mapping

from ..errors import RingtrainError
from . import env_info
from .plan import Plan
from .ports import is_loopback, is_this_machine

OVERSUBSCRIBED = 4  # workers per core (or per GPU) above which ringtrain warns
STORE_CLIENTS_PER_NODE = 3  # each node's agent: the rendezvous client and its counter (rendezvous.py), one spare
SPARE_FILES = 64  # what the agent itself keeps open: Python, torch's libraries, logs, pipes


def _numeric(nproc: str) -> int | None:
    return int(nproc) if nproc.isdigit() else None  # "auto"/"cpu"/"gpu" count the devices: never too many


def master_is_here(plan: Plan) -> None:
    """Node 0 of a fixed-size job hosts the store at ``--master-addr``: refuse another machine's address."""
    if plan.elastic or plan.node_rank != 0:
        return  # elastic: the c10d rendezvous hosts the store wherever --master-addr is
    try:
        here = is_this_machine(plan.master_addr)
    except (socket.gaierror, UnicodeError) as e:
        raise RingtrainError(
            f"--master-addr {plan.master_addr!r} does not resolve on this machine (node 0): "
            f"{getattr(e, 'strerror', None) or e}",
            "give node 0's own address or host name (e.g. the output of `hostname -I`), the same on every node.",
        ) from e
    if not here:
        raise RingtrainError(
            f"--master-addr {plan.master_addr} is not an address of this machine, but this is node 0 "
            "(--node-rank 0), which hosts the rendezvous there",
            "on node 0 give one of its own addresses (`hostname -I` lists them) and the same --master-addr on "
            "every other node; or, if node 0 is that other machine, give this node its own --node-rank.",
        )


def store_fits(plan: Plan) -> None:
    """Node 0 needs an open file per connection to its store: refuse a job that ``ulimit -n`` cannot hold."""
    if plan.elastic or plan.node_rank != 0:
        return
    limit = env_info.open_files_limit()
    if limit is None:
        return
    workers = _numeric(plan.nproc) or 1
    needed = plan.max_nodes * (workers + STORE_CLIENTS_PER_NODE) + SPARE_FILES
    if needed > limit:
        raise RingtrainError(
            f"--nnodes {plan.nnodes} with {workers} worker(s) each: node 0 would need about {needed:,} open files "
            f"for its store's connections, but this process may open only {limit:,} (ulimit -n)",
            f"check --nnodes; for a job this size raise the limit on node 0 (`ulimit -n {needed}` in the shell that "
            "starts it, or LimitNOFILE= for a systemd service).",
        )


def oversubscription(plan: Plan) -> str | None:
    """A warning line when this node would run more than OVERSUBSCRIBED workers per core, or per GPU."""
    workers = _numeric(plan.nproc)
    if workers is None:
        return None
    cores = env_info.usable_cpus()
    if workers > OVERSUBSCRIBED * cores:
        return (f"warning: {workers} workers on this node, but only {cores} CPU core(s) are usable here: more than "
                f"{OVERSUBSCRIBED} per core, so they take turns and every step waits for the slowest.\n"
                f"HINT: use --nproc-per-node {OVERSUBSCRIBED * cores} or fewer (--nproc-per-node cpu starts one per "
                "core), or spread the job over more nodes.")
    if plan.gpus is None:  # --gpus already allows at most one worker per listed GPU
        from ..parallel import devices  # imports torch: only once the command line is known to be right

        gpus = devices.visible_gpus().count
        if gpus and workers > OVERSUBSCRIBED * gpus:
            return (f"warning: {workers} workers on this node, and {gpus} GPU(s) visible: if the workers use the "
                    f"GPUs, more than {OVERSUBSCRIBED} share each one.\n"
                    "HINT: use --nproc-per-node gpu (one worker per GPU), or ignore this for CPU (Gloo) training.")
    return None


def threads_per_worker(plan: Plan, workers: int, environ: Mapping[str, str]) -> tuple[int, str] | None:
    """(OMP_NUM_THREADS, why) for this node's ``workers`` when the variable is unset and more than one rank runs
    on this machine; else None (a lone process keeps torch's own default: every core).

    The ranks on this machine are this node's workers, times the nodes when the job's address is a loopback one
    (only this machine reaches it: every node is here, as with ``-H localhost:1,127.0.0.1:1`` or two terminals)."""
    if "OMP_NUM_THREADS" in environ:  # ``environ``: the agent's, which its workers inherit
        return None
    nodes = plan.max_nodes if is_loopback(plan.master_addr) else 1
    ranks = workers * nodes
    if ranks < 2:
        return None
    cores = env_info.usable_cpus()
    here = f"{workers} worker(s) x {nodes} nodes on this machine" if nodes > 1 else f"{workers} workers"
    return max(1, cores // ranks), f"{cores} usable core(s) / {here}"


def gpus_exist(plan: Plan) -> None:
    """``--gpus I,J`` names GPUs this machine has (``--gpus 0,1`` on a machine without one ran on the CPU
    without a word, where ``--nproc-per-node gpu`` was refused)."""
    if not plan.gpus:
        return
    count = env_info.cuda_gpus()
    missing = [g for g in plan.gpus if g >= count]
    if missing:
        have = f"torch sees {count} CUDA GPU(s) here (0..{count - 1})" if count else "torch sees no CUDA GPU here"
        raise RingtrainError(f"--gpus {','.join(map(str, plan.gpus))} names GPU(s) {missing}, but {have}",
                             "list GPUs this machine has (`nvidia-smi -L`, `ringtrain env`), or leave --gpus out to "
                             "train on the CPU.")


def check(plan: Plan) -> list[str]:
    """Refuse what this machine cannot run (RingtrainError); return the warnings to print."""
    gpus_exist(plan)
    master_is_here(plan)
    store_fits(plan)
    warning = oversubscription(plan)
    return [warning] if warning else []
