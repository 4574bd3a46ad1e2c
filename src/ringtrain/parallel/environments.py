"""Who am I? One small class per way a process can be started.

Each environment reads the variables its launcher sets and answers rank, local
rank, world size, node rank and where the master is. Environments never touch
models or process groups: they only describe. ``detect()`` tries them in the
order of ``DETECTION_ORDER`` and returns the first that claims the process.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors import RingtrainError

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class Environment:
    """What a launcher told this process about its place in the job."""

    name: str
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT
    # torchrun's agent already hosts the rendezvous store: workers must join it
    # through env:// instead of opening their own store on the same port.
    init_method: str | None = None
    # Which attempt this is (torchelastic restarts workers after a failure), and where the
    # launcher wants a failing worker's error report (TORCHELASTIC_ERROR_FILE).
    restart_count: int = 0
    error_file: str | None = None

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def default_init_method(self) -> str:
        return self.init_method or f"tcp://{self.master_addr}:{self.master_port}"

    def describe(self) -> str:
        return (
            f"{self.name}: rank {self.rank}/{self.world_size}, local rank "
            f"{self.local_rank}/{self.local_world_size}, node {self.node_rank}, "
            f"master {self.master_addr}:{self.master_port}"
        )


def _int(environ: Mapping[str, str], key: str, default: int | None = None) -> int:
    value = environ.get(key)
    if value is None or value == "":
        if default is None:
            raise RingtrainError(
                f"environment variable {key} is missing while the rest of its launcher's variables are set",
                f"start the job through its launcher unchanged, or unset the partial variables ({key}).",
            )
        return default
    try:
        return int(value)
    except ValueError as e:
        raise RingtrainError(
            f"environment variable {key}={value!r} is not an integer",
            f"fix or unset {key}.",
        ) from e


def _master(environ: Mapping[str, str], fallback_addr: str = "127.0.0.1") -> tuple[str, int]:
    return environ.get("MASTER_ADDR", fallback_addr), _int(environ, "MASTER_PORT", DEFAULT_MASTER_PORT)


class TorchElastic:
    """``torchrun`` / ``ringtrain run`` / ``torch.distributed.launch --use-env``."""

    @staticmethod
    def detect(environ: Mapping[str, str], argv: Sequence[str]) -> Environment | None:
        if not all(k in environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
            return None
        world = _int(environ, "WORLD_SIZE")
        local_world = _int(environ, "LOCAL_WORLD_SIZE", 1)
        addr, port = _master(environ)
        return Environment(
            name="torchelastic" if "TORCHELASTIC_RUN_ID" in environ else "env",
            rank=_int(environ, "RANK"),
            local_rank=_int(environ, "LOCAL_RANK"),
            world_size=world,
            local_world_size=local_world,
            node_rank=_int(environ, "GROUP_RANK", _int(environ, "RANK") // max(local_world, 1)),
            master_addr=addr,
            master_port=port,
            init_method="env://",
            restart_count=_int(environ, "TORCHELASTIC_RESTART_COUNT", 0),
            error_file=environ.get("TORCHELASTIC_ERROR_FILE") or None,
        )


def _is_this_host(addr: str) -> bool:
    """Is ``addr`` (MASTER_ADDR) this machine: a loopback address or this host's name?"""
    import ipaddress
    import socket

    if addr in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        return ipaddress.ip_address(addr.strip("[]")).is_loopback
    except ValueError:
        return False


class ByHand:
    """``env://`` by hand: MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK set without a launcher.

    What the tutorials do when they start each process themselves (seed 000). Without
    LOCAL_RANK the local rank can be inferred only when every process is on this machine (the
    master is a loopback address or this host): local rank = rank. Otherwise it is refused,
    naming what is missing — never a silent job of one.
    """

    @staticmethod
    def detect(environ: Mapping[str, str], argv: Sequence[str]) -> Environment | None:
        if "RANK" not in environ or "WORLD_SIZE" not in environ or "LOCAL_RANK" in environ:
            return None
        if any(_LOCAL_RANK_ARG.match(arg) for arg in argv):
            return None  # torch.distributed.launch's --local_rank argument says it: LegacyLaunch
        rank, world = _int(environ, "RANK"), _int(environ, "WORLD_SIZE")
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not environ.get(k)]
        if missing:
            raise RingtrainError(
                f"RANK={rank} and WORLD_SIZE={world} are set but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                "not: env:// needs to know where rank 0's store listens",
                "set MASTER_ADDR and MASTER_PORT (the same on every process), or start with `ringtrain run`.",
            )
        addr, port = _master(environ)
        if not _is_this_host(addr):
            raise RingtrainError(
                f"RANK={rank} and WORLD_SIZE={world} are set but LOCAL_RANK is not, and MASTER_ADDR={addr} is another "
                "host: this process's rank on its own machine (its GPU) cannot be worked out",
                "set LOCAL_RANK (and LOCAL_WORLD_SIZE) for each process, or start with `ringtrain run`, which sets them.",
            )
        return Environment(
            name="env-by-hand", rank=rank, local_rank=rank, world_size=world, local_world_size=world,
            node_rank=0, master_addr=addr, master_port=port, init_method="env://",
        )


def _first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list: 'gpu[003-005,7],cpu1' -> 'gpu003'."""
    first = re.split(r",(?![^\[]*\])", nodelist.strip())[0]
    match = re.match(r"^(.*?)\[([^\]]+)\](.*)$", first)
    if not match:
        return first
    prefix, ranges, suffix = match.groups()
    return prefix + ranges.split(",")[0].split("-")[0] + suffix


class Slurm:
    """``srun`` tasks: one process per task, master from the node list."""

    @staticmethod
    def detect(environ: Mapping[str, str], argv: Sequence[str]) -> Environment | None:
        if "SLURM_PROCID" not in environ or "SLURM_NTASKS" not in environ:
            return None
        step = "SLURM_STEP_ID" in environ or "SLURM_STEPID" in environ  # srun's tasks have one; a batch shell not
        # mpirun inside an allocation: its ranks inherit the batch shell's SLURM_PROCID (0 in every rank: a real
        # `sbatch -n2` of `mpirun -np 2` had two rank 0s) or, on the other nodes, that of the daemon srun started
        # there (one task per node). Their MPI's variables are theirs. `srun --mpi=pmi2` sets PMI_RANK too: equal.
        if "OMPI_COMM_WORLD_RANK" in environ:
            return None
        if "PMI_RANK" in environ and (not step or environ["PMI_RANK"] != environ["SLURM_PROCID"]):
            return None
        if not step:
            # `salloc` + plain python, or `srun --pty bash`'s shell, is not an srun task.
            if environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
                return None
            ntasks = _int(environ, "SLURM_NTASKS")
            if ntasks > 1:  # the batch script's own shell: SLURM_PROCID 0 of SLURM_NTASKS, and no other task
                raise RingtrainError(
                    f"this process runs in Slurm job {environ.get('SLURM_JOB_ID', '?')}'s batch script itself, not "
                    f"as one of srun's tasks: it would be rank 0 of {ntasks} (SLURM_NTASKS) and wait for {ntasks - 1} "
                    "more that nothing starts",
                    "start it with srun (`srun python train.py`: one process per task), or one `ringtrain run` "
                    "per node (`srun ringtrain run ...`, examples/cluster/two_nodes.sbatch); for one process, "
                    "`sbatch --ntasks=1`.",
                )
        nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_NODELIST") or "127.0.0.1"
        # Same rule as Lightning: a port every task derives alike from the job id.
        job_id = _int(environ, "SLURM_JOB_ID", 0)
        default_port = 10000 + job_id % 20000 if job_id else DEFAULT_MASTER_PORT
        world = _int(environ, "SLURM_NTASKS")
        local_world = _int(environ, "SLURM_NTASKS_PER_NODE", 0) or _slurm_tasks_on_node(environ, world)
        return Environment(
            name="slurm",
            rank=_int(environ, "SLURM_PROCID"),
            local_rank=_int(environ, "SLURM_LOCALID", 0),
            world_size=world,
            local_world_size=local_world,
            node_rank=_int(environ, "SLURM_NODEID", 0),
            master_addr=environ.get("MASTER_ADDR", _first_slurm_host(nodelist)),
            master_port=_int(environ, "MASTER_PORT", default_port),
        )


def _slurm_tasks_on_node(environ: Mapping[str, str], world: int) -> int:
    # SLURM_TASKS_PER_NODE looks like "2(x3),1"; the first figure is this node's in the common case.
    spec = environ.get("SLURM_TASKS_PER_NODE", "")
    match = re.match(r"^(\d+)", spec)
    return int(match.group(1)) if match else world


class OpenMPI:
    """``mpirun`` from Open MPI."""

    @staticmethod
    def detect(environ: Mapping[str, str], argv: Sequence[str]) -> Environment | None:
        if "OMPI_COMM_WORLD_RANK" not in environ:
            return None
        rank = _int(environ, "OMPI_COMM_WORLD_RANK")
        local_world = _int(environ, "OMPI_COMM_WORLD_LOCAL_SIZE", 1)
        addr, port = _master(environ)
        return Environment(
            name="openmpi",
            rank=rank,
            local_rank=_int(environ, "OMPI_COMM_WORLD_LOCAL_RANK", 0),
            world_size=_int(environ, "OMPI_COMM_WORLD_SIZE"),
            local_world_size=local_world,
            # Not OMPI_COMM_WORLD_NODE_RANK: mpirun(1) defines it as "the relative rank of this process on this
            # node looking across ALL jobs" (a local rank; rank 1 of `mpirun -np 2` on one host has 1). Open MPI
            # names no node index; with its default mapping (by slot) the ranks fill one node after another.
            node_rank=rank // max(local_world, 1),
            master_addr=addr,
            master_port=port,
        )


class MPICH:
    """``mpiexec`` from MPICH / Intel MPI (PMI variables)."""

    @staticmethod
    def detect(environ: Mapping[str, str], argv: Sequence[str]) -> Environment | None:
        if "PMI_RANK" not in environ or "PMI_SIZE" not in environ:
            return None
        rank = _int(environ, "PMI_RANK")
        local_world = _int(environ, "MPI_LOCALNRANKS", 1)
        addr, port = _master(environ)
        return Environment(
            name="mpich",
            rank=rank,
            local_rank=_int(environ, "MPI_LOCALRANKID", 0),
            world_size=_int(environ, "PMI_SIZE"),
            local_world_size=local_world,
            node_rank=rank // max(local_world, 1),
            master_addr=addr,
            master_port=port,
        )


class Horovod:
    """Variables ``horovodrun`` sets (and ``ringtrain run --horovod`` adds)."""

    @staticmethod
    def detect(environ: Mapping[str, str], argv: Sequence[str]) -> Environment | None:
        if "HOROVOD_RANK" not in environ or "HOROVOD_SIZE" not in environ:
            return None
        local_world = _int(environ, "HOROVOD_LOCAL_SIZE", 1)
        addr, port = _master(environ, environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1"))
        return Environment(
            name="horovod",
            rank=_int(environ, "HOROVOD_RANK"),
            local_rank=_int(environ, "HOROVOD_LOCAL_RANK", 0),
            world_size=_int(environ, "HOROVOD_SIZE"),
            local_world_size=local_world,
            node_rank=_int(environ, "HOROVOD_CROSS_RANK", 0),
            master_addr=addr,
            master_port=port,
        )


_LOCAL_RANK_ARG = re.compile(r"^--local[-_]rank(?:=(\d+))?$")


class LegacyLaunch:
    """``python -m torch.distributed.launch`` without --use-env: ``--local_rank=N`` in argv.

    That launcher still exports RANK/WORLD_SIZE, so TorchElastic claims it first; this
    class covers the remainder: a script given ``--local_rank`` by hand or by an old tool.
    """

    @staticmethod
    def detect(environ: Mapping[str, str], argv: Sequence[str]) -> Environment | None:
        for i, arg in enumerate(argv):
            match = _LOCAL_RANK_ARG.match(arg)
            if not match:
                continue
            value = match.group(1) if match.group(1) is not None else (argv[i + 1] if i + 1 < len(argv) else "")
            if not value.isdigit():
                return None
            local_rank = int(value)
            world = _int(environ, "WORLD_SIZE", 1)
            addr, port = _master(environ)
            return Environment(
                name="legacy-launch",
                rank=_int(environ, "RANK", local_rank),
                local_rank=local_rank,
                world_size=world,
                local_world_size=world,
                master_addr=addr,
                master_port=port,
            )
        return None


class Single:
    """Plain ``python train.py``: one process, rank 0 of 1."""

    @staticmethod
    def detect(environ: Mapping[str, str], argv: Sequence[str]) -> Environment | None:
        return Environment(name="single")


# Order matters. torchrun first: it also runs under Slurm allocations and inside
# mpirun-started agents, and its variables describe the workers it started. RANK and
# WORLD_SIZE set by hand (without LOCAL_RANK) next: the user said so explicitly.
# Slurm before MPI: `srun --mpi=pmi2` sets PMI_* as well as SLURM_* (Slurm yields where mpirun started the
# process inside an allocation: Slurm.detect). Horovod after
# MPI because horovodrun over MPI sets both and MPI's are authoritative. The
# legacy `--local_rank` argument only when no launcher variables say more.
# Single always matches, so it is last.
DETECTION_ORDER = (TorchElastic, ByHand, Slurm, OpenMPI, MPICH, Horovod, LegacyLaunch, Single)


def detect(environ: Mapping[str, str] | None = None, argv: Sequence[str] | None = None) -> Environment:
    """Return the environment of the first class in ``DETECTION_ORDER`` that claims this process."""
    environ = os.environ if environ is None else environ
    argv = sys.argv[1:] if argv is None else argv
    for cls in DETECTION_ORDER:
        found = cls.detect(environ, argv)
        if found is not None:
            _validate(found)
            return found
    raise AssertionError("Single.detect always matches")  # pragma: no cover


def _validate(env: Environment) -> None:
    if env.world_size < 1 or not 0 <= env.rank < env.world_size:
        raise RingtrainError(
            f"{env.name} environment says rank {env.rank} of world size {env.world_size}",
            "rank must be in [0, world_size): check the launcher's variables (RANK/WORLD_SIZE or its own).",
        )
    if env.local_rank < 0:
        raise RingtrainError(
            f"{env.name} environment says local rank {env.local_rank}",
            "local rank must be >= 0: check the launcher's variables.",
        )


def with_explicit(env: Environment, world_size: int | None, rank: int | None) -> Environment:
    """Apply ``Ring(world_size=..., rank=...)``; a launcher that says otherwise is an error."""
    if world_size is None and rank is None:
        return env
    if env.is_distributed:
        if world_size is not None and world_size != env.world_size:
            raise RingtrainError(
                f"Ring(world_size={world_size}) was asked for, but the launcher ({env.name}) started "
                f"{env.world_size} processes",
                "drop world_size= and let the launcher decide, or launch with a matching process count.",
            )
        if rank is not None and rank != env.rank:
            raise RingtrainError(
                f"Ring(rank={rank}) was asked for, but the launcher ({env.name}) says this is rank {env.rank}",
                "drop rank= when a launcher starts the processes.",
            )
        return env
    if world_size is None or rank is None:
        raise RingtrainError(
            "Ring got only one of world_size= and rank=",
            "give both (with init_method='tcp://host:port' or 'file:///path'), or start with `ringtrain run`.",
        )
    if world_size < 1 or not 0 <= rank < world_size:
        raise RingtrainError(
            f"Ring got rank={rank} for world_size={world_size}",
            "rank must be in [0, world_size).",
        )
    # Processes started by hand are taken to share one node, local rank = rank.
    return dataclasses.replace(
        env, name="explicit", rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size
    )
