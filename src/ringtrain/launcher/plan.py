"""What ``ringtrain run`` is asked to launch, validated: the command line (ringtrain's flags, torchrun's and
horovodrun's, already in ringtrain's terms) becomes a ``Plan``, or a ``RingtrainError`` (exit code 2) before
anything starts. The preflight checks (preflight.py) and the agent (agent.py) read the Plan; ``-H``/``--hostfile``
plans each node's command line here too (hosts.py) before any node starts.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from dataclasses import dataclass, field

from ..errors import RingtrainError
from ..parallel import contract
from . import horovod_flags, scripts, torchrun_flags
from .flags import DEFAULT_TIMEOUT, NPROC_WORDS
from .ports import LOOPBACK, is_loopback

# The largest published torch.distributed jobs ran on 16,384 GPUs, 2,048 nodes (Llama 3,
# arXiv:2407.21783); the largest clusters hold about 100,000 GPUs (12,500 nodes of 8). 65,536
# leaves room above any real job and refuses a typo (an extra digit) before anything waits on it.
MAX_NODES = 65536
MAX_RANKS = 2**31 - 1  # ranks and world sizes are 32-bit ints in torch.distributed's C++ core



@dataclass
class Plan:
    """What to launch, validated. Everything torchrun needs comes from here."""

    nproc: str  # a positive integer as text, or "auto" / "cpu" / "gpu" for torchrun to count
    nnodes: str
    max_nodes: int
    elastic: bool
    node_rank: int
    master_addr: str
    master_port: int | None
    gpus: list[int] | None
    max_restarts: int
    log_dir: str | None
    timeout: int
    module: bool
    target: str
    target_args: list[str] = field(default_factory=list)
    local_rank_arg: str | None = None  # "--local_rank" / "--local-rank" if the script declares it
    horovod: bool = False  # workers get the `horovod` alias and HOROVOD_* (worker.py --horovod)
    timeline: str | None = None  # --timeline's folder, or FILE.json (checked), merged here after the job
    rdzv_backend: str | None = None  # an elastic job's torchrun backend (c10d, etcd...); None: ringtrain's static one
    rdzv_id: str | None = None  # --rdzv-id: the run id (TORCHELASTIC_RUN_ID)
    rdzv_conf: dict = field(default_factory=dict)  # --rdzv-conf, over ringtrain's defaults
    no_python: bool = False  # --no-python: the target is a program, executed as it is
    torchrun: dict = field(default_factory=dict)  # torchrun's flags passed to its agent as given (torchrun_flags.py)
    environment: dict = field(default_factory=dict)  # variables for the workers from horovodrun's flags
    verbose: bool = False  # horovodrun's --verbose: say what is started
    preempt_signal: str | None = None  # --preempt-signal: a second signal (beside SIGTERM) that preempts the job


def _parse_gpus(text: str) -> list[int]:
    items = [item.strip() for item in text.split(",")]
    if not items or not all(item.isdigit() for item in items):
        raise RingtrainError(
            f"--gpus {text!r} is not a comma-separated list of GPU indices",
            "write the indices as nvidia-smi lists them, e.g. --gpus 0,1 (not 'cuda:0').",
        )
    return [int(item) for item in items]


def _parse_nnodes(text: str) -> tuple[int, int]:
    parts = text.split(":")
    try:
        low, high = (int(parts[0]), int(parts[0])) if len(parts) == 1 else (int(parts[0]), int(parts[1]))
    except (ValueError, IndexError) as e:
        raise RingtrainError(f"--nnodes {text!r} is neither N nor MIN:MAX", "e.g. --nnodes 2 or --nnodes 1:4.") from e
    if len(parts) > 2 or not 1 <= low <= high:
        raise RingtrainError(f"--nnodes {text!r} is not a valid node count", "use N >= 1, or MIN:MAX with 1 <= MIN <= MAX.")
    if high > MAX_NODES:
        raise RingtrainError(f"--nnodes {text!r}: more than {MAX_NODES:,} nodes, more than any torch.distributed job "
                             "has run on", "check the number (an extra digit?): give the number of machines in the job.")
    return low, high


def _resolve_nproc(text: str, gpus: list[int] | None) -> str:
    if text == "gpu":
        import torch

        if not torch.cuda.is_available():  # with --gpus too: 2 CPU processes are not what was asked
            listed = f" --gpus {','.join(map(str, gpus))}" if gpus is not None else ""
            raise RingtrainError(
                f"--nproc-per-node gpu{listed}, but torch sees no CUDA GPU here",
                "give a number (--nproc-per-node 2) or 'cpu'; run `ringtrain env` to see what torch finds.",
            )
    if text in ("gpu", "auto") and gpus is not None:
        return str(len(gpus))  # one worker per GPU the user listed
    if text == "gpu":
        return text
    if text in NPROC_WORDS:
        return text
    try:
        n = int(text)
    except ValueError as e:
        raise RingtrainError(f"--nproc-per-node {text!r} is not a number", "use a positive integer or one of: auto, gpu, cpu.") from e
    if n < 1:
        raise RingtrainError(f"--nproc-per-node {n}: a node needs at least one worker", "use --nproc-per-node 1 or more.")
    if gpus is not None and n > len(gpus):
        raise RingtrainError(
            f"--nproc-per-node {n} workers but --gpus lists only {len(gpus)} GPU(s)",
            "list one GPU per worker, or use --nproc-per-node gpu to start one worker per listed GPU.",
        )
    return str(n)


def _nproc_text(ns: argparse.Namespace) -> str:
    """--nproc-per-node, or -np for a single node (horovodrun's `-np N` on this machine)."""
    np = getattr(ns, "np", None)
    if np is None:
        if ns.nproc_per_node is not None and not ns.nproc_per_node.strip():
            raise RingtrainError("--nproc-per-node '' is empty", "give a number of workers, e.g. --nproc-per-node 2, or "
                                 "one of: auto, gpu, cpu.")
        return ns.nproc_per_node or "1"
    if np < 1:
        raise RingtrainError(f"-np {np}: a job needs at least one process", "use -np 1 or more.")
    if ns.nproc_per_node is not None and ns.nproc_per_node != str(np):
        raise RingtrainError(
            f"-np {np} and --nproc-per-node {ns.nproc_per_node} disagree: without -H/--hostfile, -np is the "
            "number of processes on this one node",
            "give only one of them (or -H host:N,... to spread -np over several nodes).",
        )
    if (ns.nnodes or "1") != "1":
        raise RingtrainError(f"-np {np} with --nnodes {ns.nnodes}: -np counts processes of the whole job",
                             "use --nproc-per-node per node with --nnodes, or -np with -H/--hostfile.")
    return str(np)


def _script_rendezvous(ns: argparse.Namespace, tcp: tuple[str, int] | None, elastic: bool) -> int | None:
    """The master port, when the script names its own ``init_method="tcp://host:port"``: the store goes there."""
    if tcp is None or elastic:
        return ns.master_port
    host, port = tcp
    where = f"init_method='tcp://{host}:{port}'"
    if ns.master_port is not None and ns.master_port != port:
        raise RingtrainError(
            f"the script rendezvouses at {where} but --master-port is {ns.master_port}: its workers would wait "
            "for a store nobody runs",
            f"drop --master-port (ringtrain hosts the store at {port}), give --master-port {port}, or write "
            "init_method='env://' in the script.",
        )
    if not (is_loopback(host) or host in (ns.master_addr, "localhost")):
        raise RingtrainError(
            f"the script rendezvouses at {where} but the job's store is on --master-addr {ns.master_addr}",
            f"pass --master-addr {host} (node 0's address), or write init_method='env://' in the script.",
        )
    if ns.max_restarts:
        raise RingtrainError(
            f"--max-restarts {ns.max_restarts} with a script that rendezvouses at the fixed address {where}: "
            "restarted workers would meet in the failed attempt's store",
            "write init_method='env://' (or leave it out) in the script, so each attempt gets a fresh store.",
        )
    return port


def _horovod_alias_needed(source: str, ns: argparse.Namespace, interpreter: bool) -> bool:
    """horovodrun's own command line (``-np 2 -H localhost:2 python train.py``: its flags, or the interpreter
    before the script) on a script that imports Horovod where none is installed runs on ringtrain's Horovod, as
    ``--horovod`` asks; said once. A torchrun-style line keeps the script as it is."""
    horovodrun_line = interpreter or any(getattr(ns, name, None) is not None for name in ("np", "hosts", "hostfile"))
    if not horovodrun_line or not source or not scripts.imports_horovod(source) or scripts.horovod_installed():
        return False
    print("ringtrain run: the script imports horovod, which is not installed here: it runs on ringtrain's Horovod "
          "API (as with --horovod).", file=sys.stderr, flush=True)
    return True


def _preemption(ns: argparse.Namespace, torchrun: dict, environment: dict) -> str | None:
    """``--preempt-signal SIG`` and ``--preempt-grace SECONDS`` (loop/preempt.py): the workers' rings take them
    (RINGTRAIN_PREEMPT_SIGNAL, RINGTRAIN_PREEMPT_GRACE), torchrun's agent passes the signal on to them
    (``--signals-to-handle``) and waits the grace for them to save (``--shutdown-timeout``), unless those
    flags are given. Returns the signal's name."""
    name = None
    given = getattr(ns, "preempt_signal", None)
    if given is not None:
        name = signal.Signals(contract.signal_of(given, "--preempt-signal")).name
        environment.update(contract.to_environ(preempt_signal=name))
        if name != "SIGTERM":
            handled = torchrun.get("signals_to_handle") or "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
            if name not in [s.strip() for s in handled.split(",")]:
                torchrun["signals_to_handle"] = f"{handled},{name}"
    grace = getattr(ns, "preempt_grace", None)
    if grace is not None:
        grace = contract.check_grace(grace, "--preempt-grace")
        environment.update(contract.to_environ(preempt_grace=grace))
        if torchrun.get("shutdown_timeout") is None:
            torchrun["shutdown_timeout"] = math.ceil(grace)
    return name


MAX_SECONDS = 10**7  # 115 days: longer than any job waits; torch's timeouts overflow past ~2**63 ns


def _check_numbers(ns: argparse.Namespace) -> None:
    """torchrun's numeric flags, refused here with a HINT instead of by torchelastic tens of seconds into the job
    (``--monitor-interval 0`` failed its assert after 26-51 s) or with a traceback; and --log-dir, a folder."""
    interval = getattr(ns, "monitor_interval", None)
    if interval is not None and not (math.isfinite(interval) and 0 < interval <= 3600):
        raise RingtrainError(f"--monitor-interval {interval}: must be a number of seconds above 0 (at most 3600)",
                             "torchrun's default is 0.1; e.g. --monitor-interval 1.")
    shutdown = getattr(ns, "shutdown_timeout", None)
    if shutdown is not None and not 0 <= shutdown <= MAX_SECONDS:
        raise RingtrainError(f"--shutdown-timeout {shutdown}: must be 0 to {MAX_SECONDS:,} seconds",
                             "torchrun's default is 30: the seconds stopping workers get before SIGKILL.")
    contract.read()  # what the workers will read (RINGTRAIN_STALL_WARNING=nan would never fire): refused here, once
    log_dir = getattr(ns, "log_dir", None)
    if log_dir is not None and (not log_dir or (os.path.lexists(log_dir) and not os.path.isdir(log_dir))):
        raise RingtrainError(f"--log-dir {log_dir!r} is not a folder" + (" (a file is there)" if log_dir else ""),
                             "give a folder (it is made if missing), or leave --log-dir out for a temporary one.")


def plan_from_args(ns: argparse.Namespace) -> Plan:
    """Validate the command line. Raises RingtrainError (exit code 2) before anything starts."""
    ns = torchrun_flags.apply(horovod_flags.apply(ns))  # the tools' flags in ringtrain's terms
    for name, default in (("nnodes", "1"), ("node_rank", 0), ("master_addr", LOOPBACK), ("timeout", DEFAULT_TIMEOUT)):
        if getattr(ns, name, None) is None:
            setattr(ns, name, default)
    gpus = _parse_gpus(ns.gpus) if ns.gpus is not None else None
    nproc = _resolve_nproc(_nproc_text(ns), gpus)
    _, max_nodes = _parse_nnodes(ns.nnodes)
    if nproc.isdigit() and int(nproc) * max_nodes > MAX_RANKS:
        raise RingtrainError(f"--nproc-per-node {nproc} x --nnodes {ns.nnodes}: more ranks than torch.distributed can "
                             f"number ({MAX_RANKS:,})", "give the number of workers on each node (e.g. one per GPU).")
    if not 0 <= ns.node_rank < max_nodes:
        raise RingtrainError(
            f"--node-rank {ns.node_rank} with --nnodes {ns.nnodes}: node ranks are 0..{max_nodes - 1}",
            "number the nodes from 0 (the master) to nnodes-1, each node a different rank.",
        )
    if ns.master_port is not None and not 1 <= ns.master_port <= 65535:
        raise RingtrainError(f"--master-port {ns.master_port} is not a TCP port", "use 1..65535, or omit it on a single node.")
    if not 1 <= ns.timeout <= MAX_SECONDS:
        raise RingtrainError(f"--timeout {ns.timeout}: must be 1 to {MAX_SECONDS:,} seconds", "e.g. --timeout 300.")
    _check_numbers(ns)
    if ns.max_restarts < 0:
        raise RingtrainError(f"--max-restarts {ns.max_restarts} is negative", "use 0 (no restarts) or more.")
    no_python = getattr(ns, "no_python", False)
    if no_python:
        ns.script = scripts.check_program(ns.script, ns.module)
        source, interpreter = "", False
    else:
        # horovodrun's command form: `-np 2 python train.py` (or `python -m pkg.mod`).
        given = ns.script
        ns.script, ns.script_args, ns.module = scripts.strip_interpreter(ns.script, list(ns.script_args), ns.module)
        interpreter = ns.script != given
        if ns.module:
            source_file = scripts.module_file(ns.script)
        else:
            source_file = scripts.check_script(ns.script)
        source = scripts.read_source(source_file) if source_file else ""
    spelling = scripts.local_rank_spelling(source)
    master_port = _script_rendezvous(ns, scripts.tcp_rendezvous(source), ns.elastic)
    timeline = getattr(ns, "timeline", None)
    if timeline is not None:
        from ..tracking.timeline import check_target  # no torch: --help and argument errors stay fast

        folder, name = check_target(timeline, "--timeline")
        timeline = os.path.join(folder, f"{name}.json") if timeline.endswith(".json") else folder
    environment = horovod_flags.environment(ns)[0]
    torchrun = torchrun_flags.passthrough_values(ns)
    preempt_signal = _preemption(ns, torchrun, environment)
    return Plan(
        nproc=nproc,
        nnodes=ns.nnodes,
        max_nodes=max_nodes,
        elastic=ns.elastic,
        node_rank=ns.node_rank,
        master_addr=ns.master_addr,
        master_port=master_port,
        gpus=gpus,
        max_restarts=ns.max_restarts,
        log_dir=ns.log_dir,
        timeout=ns.timeout,
        module=ns.module,
        target=ns.script,
        target_args=list(ns.script_args),
        local_rank_arg=spelling,
        horovod=getattr(ns, "horovod", False) or _horovod_alias_needed(source, ns, interpreter),
        timeline=timeline,
        rdzv_backend=ns.rdzv_backend,
        rdzv_id=getattr(ns, "rdzv_id", None),
        rdzv_conf=ns.rdzv_conf,
        no_python=no_python,
        torchrun=torchrun,
        environment=environment,
        verbose=bool(getattr(ns, "verbose", False)),
        preempt_signal=preempt_signal,
    )
