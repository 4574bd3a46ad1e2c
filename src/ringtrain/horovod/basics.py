"""``hvd.init()`` and the questions a Horovod script asks about its job.

``init()`` joins the job the same way ``ringtrain.Ring`` does: the environment is
detected by ``ringtrain.parallel.environments`` (torchrun / ``ringtrain run``, Slurm, MPI,
``horovodrun``'s HOROVOD_* variables ...) and the process group is formed by the
process-group service every strategy uses (``parallel/group.py``): NCCL beside Gloo
when each process has a GPU, Gloo otherwise, and the liveness watchdog that stops this
rank within seconds when a peer fails or finishes while this rank still waits for it
(Horovod: "Horovod has been shut down ... after one of the ranks finished execution").
With no launcher it is a job of one process and no group is needed.

Read at ``init()`` (through the launcher contract, parallel/contract.py), as Horovod reads them:
``HOROVOD_FUSION_THRESHOLD`` (bytes per
gradient bucket, default 64 MiB), ``RINGTRAIN_HVD_CHECKS=0`` (turn the
cross-rank metadata check off; ``init(checks=False)`` does the same) and
``RINGTRAIN_DEBUG_COLLECTIVES=1`` (or a number of seconds: the check travels through the
rendezvous store instead, so a rank that never arrives is named after that long, as under
``Ring(debug_collectives=...)``), and ``HOROVOD_TIMELINE=file`` (``start_timeline(file)`` at ``init()``;
``ringtrain run --timeline DIR`` works too).
"""

from __future__ import annotations


import torch
import torch.distributed as dist

from ..comm import DEFAULT_FUSION_THRESHOLD, GLOBAL, ProcessSet, ProcessSetTable, ReduceOp
from ..comm.store_check import StoreRows
from ..errors import RingtrainError
from ..liveness.activity import Activity
from ..parallel import contract, environments
from ..parallel.group import GroupOptions, ProcessGroup
from ..tracking import timeline

Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT

global_process_set = GLOBAL


class NotInitializedError(RingtrainError, ValueError):
    """Raised by queries before ``init()`` (a ValueError, as Horovod raises)."""


class _Runtime:
    def __init__(self) -> None:
        self.initialized = False
        self.group: ProcessGroup | None = None
        self.env = None
        self.checks = True
        self.fusion_threshold = DEFAULT_FUSION_THRESHOLD
        self.local_rank = 0
        self.local_size = 1
        self.cross_rank = 0
        self.cross_size = 1
        self.homogeneous = True
        self.table = ProcessSetTable()
        self.topology_for = None  # (default group, topology) of the last init
        self.timeline = None  # the timeline.Recorder start_timeline started
        self.activity = Activity()  # what the main thread reports for Horovod's API (init sets it)


RUNTIME = _Runtime()


def init(comm=None, process_sets=None, *, checks: bool | None = None) -> None:
    """Join the job (a no-op if already initialized). ``process_sets``: sets to register now, or "dynamic"."""
    if comm is not None:
        raise RingtrainError(
            "hvd.init(comm=...) was given an MPI communicator; ringtrain runs on torch.distributed, not MPI",
            "call hvd.init() and use process sets (hvd.add_process_set) for subsets of ranks.",
        )
    rt = RUNTIME
    if not rt.initialized:
        env = environments.detect()
        if not dist.is_initialized() and env.world_size > 1:
            # Horovod never picks devices; NCCL (through DDP's choice) only when every local
            # rank has its own GPU, Gloo otherwise (Gloo also moves CUDA tensors for most ops).
            enough_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= env.local_world_size
            group = ProcessGroup(env, GroupOptions.of(device="auto" if enough_gpus else "cpu"))
            group.form()  # leaving is the group's own business: at exit, nothing waits on peers
            rt.group = group
        rt.env = env
        # What this process's main thread reports for Horovod's API: the group's (its watchdog reads it), or
        # one of the API's own when a ring made the group.
        rt.activity = rt.group.activity if rt.group is not None else Activity()
        GLOBAL.activity = rt.activity  # a timeline hears the API's gradient buckets
        settings = contract.read()  # the launcher's (and Horovod's own) variables, read once here
        rt.checks = settings.hvd_checks if checks is None else checks
        rt.fusion_threshold = DEFAULT_FUSION_THRESHOLD if settings.fusion_threshold is None else settings.fusion_threshold
        rt.table.reset()
        GLOBAL.bind()
        debug = settings.debug_collectives
        if debug is not None and rt.group is not None and rt.checks and GLOBAL.checker is None:
            # Once per group: after shutdown() and init() the rounds go on where they were.
            GLOBAL.checker = StoreRows(rt.group.check_store(), debug, "hvd-check")
        _topology(rt, env)
        rt.initialized = True
        # HOROVOD_TIMELINE=file (Horovod's; DYNAMIC: wait for start_timeline) or ringtrain run --timeline's folder.
        wanted = settings.horovod_timeline or settings.timeline
        if wanted and wanted != "DYNAMIC" and rt.activity.recorder is None:
            start_timeline(wanted)
    elif checks is not None:
        rt.checks = checks
    if process_sets is not None and process_sets != "dynamic":
        for ps in process_sets:
            if ps.process_set_id is None:
                rt.table.add(ps)


def _topology(rt: _Runtime, env) -> None:
    """Local and cross ranks (cross = the ranks sharing this local rank, one per node)."""
    size = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    local = (env.local_rank, env.local_world_size) if env.world_size == size else (rank, size)
    everyone = [local]
    world = dist.group.WORLD if dist.is_initialized() else None
    if size > 1 and rt.topology_for is not None and rt.topology_for[0] is world:
        # init() after shutdown() on the same group: the topology cannot have changed, and a
        # collective here would pair with whatever a peer is running (init is per rank in Horovod).
        everyone = rt.topology_for[1]
    elif size > 1:
        everyone = [None] * size
        dist.all_gather_object(everyone, local, group=GLOBAL.group_for(None))
        rt.topology_for = (world, everyone)
    rt.local_rank, rt.local_size = local
    peers = [r for r, (lr, _) in enumerate(everyone) if lr == rt.local_rank]
    rt.cross_rank, rt.cross_size = peers.index(rank), len(peers)
    rt.homogeneous = len({ls for _, ls in everyone}) == 1


def shutdown() -> None:
    """Leave Horovod (process sets go with it); ``init()`` may be called again.

    The engine's process group itself stays until the process exits: torch reuses a
    destroyed default group's store keys when it is formed again on the same store,
    so a second rendezvous would read the first one's stale addresses and hang.
    ``init()`` after ``shutdown()`` (Horovod's pattern, and elastic resets) adopts it.
    """
    rt = RUNTIME
    if not rt.initialized:
        return
    stop_timeline()
    rt.table.reset()
    rt.initialized = False


def is_initialized() -> bool:
    """True once ``hvd.init()`` has run in this process."""
    return RUNTIME.initialized


def require_init() -> _Runtime:
    if not RUNTIME.initialized:
        raise NotInitializedError("Horovod has not been initialized; use hvd.init().",
                                  "call hvd.init() once at the start of the script, before any other hvd call.")
    return RUNTIME


def size() -> int:
    """The number of ranks in the job (Horovod's ``hvd.size()``)."""
    require_init()
    return GLOBAL.size()


def rank() -> int:
    """This process's rank in the job, 0 .. ``size() - 1``."""
    require_init()
    return GLOBAL.rank()


def local_size() -> int:
    """The number of ranks on this node."""
    return require_init().local_size


def local_rank() -> int:
    """This process's rank among the ranks of its node."""
    return require_init().local_rank


def cross_size() -> int:
    """The number of nodes that hold a rank of this process's local rank."""
    return require_init().cross_size


def cross_rank() -> int:
    """This process's node index among the nodes of ``cross_size()``."""
    return require_init().cross_rank


def is_homogeneous() -> bool:
    """True when every node runs the same number of ranks."""
    return require_init().homogeneous


# --- what was built / what runs: answered from what torch provides -------------
def mpi_built() -> bool:
    """True when torch was built with MPI (``torch.distributed.is_mpi_available()``)."""
    return dist.is_available() and dist.is_mpi_available()


def mpi_enabled() -> bool:
    """True when this job runs on the MPI backend."""
    return RUNTIME.initialized and dist.is_initialized() and dist.get_backend() == "mpi"


def mpi_threads_supported() -> bool:
    """True under MPI; raises ``ValueError`` (Horovod's message) when MPI is not enabled."""
    if not mpi_enabled():
        raise ValueError("Horovod MPI is not enabled; Please make sure it's installed and enabled.")
    return True


def gloo_built() -> bool:
    """True when torch was built with Gloo."""
    return dist.is_available() and dist.is_gloo_available()


def gloo_enabled() -> bool:
    """True when CPU tensors travel over Gloo in this job (the backend, or the twin under NCCL)."""
    return RUNTIME.initialized and dist.is_initialized() and (
        dist.get_backend() == "gloo" or GLOBAL.group_for(None) is not None)


def nccl_built() -> int:
    """The NCCL version code torch was built with (e.g. 22105 for 2.21.5), 0 without NCCL."""
    if not (dist.is_available() and dist.is_nccl_available() and torch.version.cuda):
        return 0
    try:
        major, minor, patch = torch.cuda.nccl.version()[:3]
    except (RuntimeError, AttributeError, TypeError):
        return 0
    # NCCL's own NCCL_VERSION_CODE rule (nccl.h): the encoding widened at 2.9.
    return major * 1000 + minor * 100 + patch if (major, minor) <= (2, 8) else major * 10000 + minor * 100 + patch


def ddl_built() -> bool:
    """False: IBM DDL is not one of torch's backends."""
    return False


def ccl_built() -> bool:
    """False: oneCCL is not one of the backends ringtrain runs on."""
    return False


def cuda_built() -> bool:
    """True when torch was built with CUDA."""
    return torch.version.cuda is not None


def rocm_built() -> bool:
    """True when torch was built with ROCm (HIP)."""
    return getattr(torch.version, "hip", None) is not None


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Record this rank's timeline (each gradient bucket's all-reduce, the optimizer steps, the ring's phases
    when a ring runs too) until ``stop_timeline()``; parts ``<file>.rank-<r>.json`` go beside ``file_path``,
    and whoever finds every rank's part merges them into ``file_path`` (one Chrome trace, a lane per rank) and
    ``<file>.png`` (ringtrain/tracking/timeline.py). ``mark_cycles`` is accepted: there are no cycles to mark (buckets
    go out when they are complete, not on Horovod's cycle clock). Another call first stops the running one."""
    rt = require_init()
    stop_timeline()
    RUNTIME.timeline = timeline.start(file_path, GLOBAL.rank(), GLOBAL.size(), timeline.job_of(rt.env), rt.activity)


def stop_timeline() -> None:
    """Stop recording; write this rank's part (merged as ``start_timeline`` says). Never waits on the others."""
    recorder, RUNTIME.timeline = RUNTIME.timeline, None
    if recorder is not None:
        recorder.close()


# --- process sets ---------------------------------------------------------------
def add_process_set(process_set) -> ProcessSet:
    """Register a set (a ProcessSet or a list of ranks) on every rank, collectively; returns it."""
    return require_init().table.add(process_set)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set on every rank, collectively; True when it was registered."""
    return require_init().table.remove(process_set)


def resolve(process_set) -> ProcessSet:
    """The registered ProcessSet a collective runs on (``None`` means the global set)."""
    require_init()
    if process_set is None:
        return GLOBAL
    if not isinstance(process_set, ProcessSet):
        raise RingtrainError(f"process_set={process_set!r} is not a ProcessSet",
                             "pass hvd.global_process_set or a set returned by hvd.add_process_set().")
    return process_set
