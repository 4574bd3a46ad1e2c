"""torchrun's and torch.distributed.launch's flags on ``ringtrain run``: which exist, what they become.

ringtrain run accepts every option of ``torch.distributed.run.get_args_parser()`` (torch 2.13) and of
``torch.distributed.launch`` (the same parser plus ``--use-env``), in both spellings, and the
abbreviations torch's argparse accepts (``--nnode=1`` for ``--nnodes``; ``prefixes.py``). Each one is

* ringtrain's own (``--nnodes``, ``--nproc-per-node``, ``--node-rank``, ``--master-addr``,
  ``--master-port``, ``--max-restarts``, ``--log-dir``, ``-m``, ``--use-env``): run.py's Plan;
* a rendezvous flag (``--standalone``, ``--rdzv-backend/-endpoint/-id/-conf``): ``apply`` turns it
  into ringtrain's terms before the Plan is validated, with torchrun's meaning (below);
* passed to torchrun's agent unchanged (``PASS_THROUGH``): torchrun's own parser reads them in
  ``torchrun_argv``, so they mean exactly what they mean under torchrun;
* or refused with a HINT (``REFUSED``; none today: tests/launcher/test_flag_parity.py fails the day
  a new torch adds an option that is in none of these lists).

Rendezvous, as torchrun reads it (torch/distributed/run.py ``run``/``config_from_args``):

* ``--standalone``: one node, a free port on this machine; explicit rdzv values are ignored.
  ringtrain's single-node default already is that (its fresh-store rendezvous, rendezvous.py).
* ``--rdzv-backend static`` (torchrun's default): fixed node ranks; ``--rdzv-endpoint HOST:PORT``,
  when given, replaces ``--master-addr``/``--master-port``.
* any other backend (``c10d``, ``etcd``, ``etcd-v2``): membership by rendezvous, node ranks assigned
  by it (``--node-rank`` ignored), the store at ``--rdzv-endpoint`` (default ``--master-addr`` and
  ``--master-port``). So is ``--nnodes MIN:MAX``, whenever the count is a range, equal ends included
  (``--nnodes 2:2`` on two agents forms one job of two nodes).

No torch import here: ``--help`` and argument errors stay fast.
"""

from __future__ import annotations

import argparse
import re
from typing import NamedTuple

from ..errors import RingtrainError


class Flag(NamedTuple):
    strings: tuple  # option strings, the dashed spelling first
    dest: str
    kwargs: dict  # for add_argument (type, choices, metavar, action, help)


_SWITCH = {"action": "store_true", "default": False}

# Passed to torchrun's agent as given (None / False: not given, torchrun's default applies).
PASS_THROUGH = (
    Flag(("--monitor-interval", "--monitor_interval"), "monitor_interval",
         {"type": float, "metavar": "SECONDS", "help": "how often the agent checks the workers (torchrun's; 0.1)."}),
    Flag(("--start-method", "--start_method"), "start_method",
         {"choices": ("spawn", "fork", "forkserver"),
          "help": "multiprocessing start method (torchrun's; it applies to function entry points only)."}),
    Flag(("--event-log-handler", "--event_log_handler"), "event_log_handler",
         {"metavar": "NAME", "help": "a registered torchelastic event log handler (torchrun's; 'null')."}),
    Flag(("--role",), "role", {"metavar": "NAME", "help": "the workers' role name, ROLE_NAME (torchrun's; 'default')."}),
    Flag(("-r", "--redirects"), "redirects",
         {"metavar": "STD", "help": "redirect workers' output into --log-dir files: 0 none, 1 stdout, 2 stderr, "
          "3 both, or per local rank 0:1,1:2 (torchrun's)."}),
    Flag(("-t", "--tee"), "tee",
         {"metavar": "STD", "help": "like --redirects, but the output also shows here (torchrun's)."}),
    Flag(("--local-ranks-filter", "--local_ranks_filter"), "local_ranks_filter",
         {"metavar": "R,R,...", "help": "show only these local ranks' output here (torchrun's)."}),
    Flag(("--duplicate-stdout-filters", "--duplicate_stdout_filters"), "duplicate_stdout_filters",
         {"metavar": "A,B", "help": "copy stdout lines containing A or B to a file in --log-dir (torchrun's)."}),
    Flag(("--duplicate-stderr-filters", "--duplicate_stderr_filters"), "duplicate_stderr_filters",
         {"metavar": "A,B", "help": "the same for stderr (torchrun's)."}),
    Flag(("--local-addr", "--local_addr"), "local_addr",
         {"metavar": "ADDR", "help": "this node's address, as the rendezvous publishes it (torchrun's)."}),
    Flag(("--logs-specs", "--logs_specs"), "logs_specs",
         {"metavar": "NAME", "help": "a torchrun.logs_specs entry point for custom log files (torchrun's)."}),
    Flag(("--numa-binding", "--numa_binding"), "numa_binding",
         {"choices": ("node", "socket", "exclusive", "core-complex"),
          "help": "bind workers to the CPUs near their GPU (torchrun's)."}),
    Flag(("--signals-to-handle", "--signals_to_handle"), "signals_to_handle",
         {"metavar": "SIG,...", "help": "signals the agent forwards to workers and stops on (torchrun's; "
          "SIGTERM,SIGINT,SIGHUP,SIGQUIT). SIGUSR1 is ringtrain's stack request and cannot be listed."}),
    Flag(("--shutdown-timeout", "--shutdown_timeout"), "shutdown_timeout",
         {"type": int, "metavar": "SECONDS", "help": "how long stopping workers get before SIGKILL (torchrun's; 30)."}),
    Flag(("--virtual-local-rank", "--virtual_local_rank"), "virtual_local_rank",
         {**_SWITCH, "help": "LOCAL_RANK=0 in every worker, each seeing only its GPU (torchrun's)."}),
)

RENDEZVOUS = (
    Flag(("--standalone",), "standalone",
         {**_SWITCH, "help": "one node on this machine, a free port (torchrun's); rdzv flags are then ignored. "
          "What ringtrain does anyway when --nnodes is 1."}),
    Flag(("--rdzv-backend", "--rdzv_backend"), "rdzv_backend",
         {"metavar": "NAME", "help": "static (fixed node ranks; the default) or c10d / etcd / etcd-v2 "
          "(nodes join by rendezvous and get their ranks from it; elastic)."}),
    Flag(("--rdzv-endpoint", "--rdzv_endpoint"), "rdzv_endpoint",
         {"metavar": "HOST[:PORT]", "help": "where the rendezvous runs: replaces --master-addr/--master-port "
          "(c10d's port: 29400 when left out)."}),
    Flag(("--rdzv-id", "--rdzv_id"), "rdzv_id",
         {"metavar": "ID", "help": "the job's id, the same on every node (TORCHELASTIC_RUN_ID)."}),
    Flag(("--rdzv-conf", "--rdzv_conf"), "rdzv_conf",
         {"metavar": "K=V,...", "help": "rendezvous settings, e.g. join_timeout=600,last_call_timeout=30 "
          "(yours win over ringtrain's)."}),
)

PROGRAM = (
    Flag(("--no-python", "--no_python"), "no_python",
         {**_SWITCH, "help": "the target is a program to execute (a binary, a shell script), not a Python "
          "script (torchrun's)."}),
    Flag(("--run-path", "--run_path"), "run_path",
         {**_SWITCH, "help": "run the script with runpy.run_path (torchrun's): what ringtrain's worker always "
          "does; accepted."}),
)

# torchrun flags ringtrain cannot honour: option string -> HINT. None today (see the module docstring).
REFUSED: dict = {}

# dest -> the flag as torchrun's parser takes it back (torchrun_argv).
PASS_THROUGH_DESTS = {flag.dest: next(s for s in flag.strings if s.startswith("--")) for flag in PASS_THROUGH}

STATIC = "static"
C10D_PORT = 29400  # torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py's default
_STD = re.compile(r"^[0-3]$|^\d+:[0-3](,\d+:[0-3])*$")


def add_to(parser: argparse.ArgumentParser, add) -> None:
    """Add the flags above; ``add(group, flag)`` adds one with its spellings (flags.py)."""
    group = parser.add_argument_group("torchrun's rendezvous (see \"torchrun's flags\" below)")
    for flag in RENDEZVOUS:
        add(group, flag)
    group = parser.add_argument_group("torchrun's other flags, passed to its agent as they are")
    for flag in (*PROGRAM, *PASS_THROUGH):
        add(group, flag)


def parse_conf(text: str) -> dict:
    """``k=v,k=v`` as torchrun reads --rdzv-conf (rendezvous/utils.py ``_parse_rendezvous_config``)."""
    conf = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise RingtrainError(f"--rdzv-conf {text!r}: {item!r} is not key=value",
                                 "write --rdzv-conf key=value,key=value (e.g. join_timeout=600).")
        conf[key.strip()] = value.strip()
    return conf


def split_endpoint(text: str, default_port: int | None) -> tuple:
    """``host``, ``host:port``, ``[v6]:port`` -> (host, port or default_port)."""
    text = text.strip()
    match = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?|([^:\[\]]+)(?::(\d+))?", text)
    if not match:
        raise RingtrainError(f"--rdzv-endpoint {text!r} is not HOST[:PORT]",
                             "e.g. --rdzv-endpoint 10.0.0.1:29400 (an IPv6 address in brackets: [fe80::1]:29400).")
    host = match.group(1) or match.group(3)
    port = match.group(2) or match.group(4)
    return (f"[{host}]" if match.group(1) else host), (int(port) if port else default_port)


def _check_values(ns: argparse.Namespace) -> None:
    for dest in ("redirects", "tee"):
        value = getattr(ns, dest, None)
        if value is not None and not _STD.match(value):
            raise RingtrainError(f"--{dest} {value!r} is neither 0-3 nor LOCAL_RANK:0-3,...",
                                 f"e.g. --{dest} 3 (stdout and stderr of every worker) or --{dest} 0:3 (local rank 0's); "
                                 "the files go under --log-dir.")
    signals = getattr(ns, "signals_to_handle", None)
    preempt_usr1 = str(getattr(ns, "preempt_signal", None) or "").strip().upper() in ("USR1", "SIGUSR1", "10")
    if signals is not None and "SIGUSR1" in [s.strip() for s in signals.split(",")] and not preempt_usr1:
        raise RingtrainError("--signals-to-handle lists SIGUSR1, which ringtrain run answers itself: every rank "
                             "prints its stack (ringtrain stacks)",
                             "leave SIGUSR1 out; to preempt the job on SIGUSR1 (Slurm's --signal=USR1@90), give "
                             "--preempt-signal USR1 (the stack request moves to SIGUSR2).")


def apply(ns: argparse.Namespace) -> argparse.Namespace:
    """The rendezvous flags in ringtrain's terms: a new namespace with ``elastic``, ``rdzv_backend`` (None:
    ringtrain's static one), ``rdzv_conf`` (a dict) and ``master_addr``/``master_port`` from the endpoint."""
    ns = argparse.Namespace(**vars(ns))
    _check_values(ns)
    backend = getattr(ns, "rdzv_backend", None) or STATIC
    endpoint = getattr(ns, "rdzv_endpoint", None)
    conf = parse_conf(getattr(ns, "rdzv_conf", None) or "")
    if getattr(ns, "standalone", False):
        nnodes = ns.nnodes or "1"
        if nnodes.split(":")[-1] != "1":
            raise RingtrainError(f"--standalone with --nnodes {nnodes}: a standalone job is one node on this machine",
                                 "drop --standalone and give --master-addr/--master-port (or --rdzv-endpoint), "
                                 "or run one node.")
        # torchrun: "--rdzv-backend, --rdzv-endpoint, --rdzv-id are auto-assigned and any explicitly set
        # values are ignored"; it sets master_port for a store nobody uses. Here: ringtrain's own single node.
        ns.nnodes, ns.master_port, backend, endpoint, conf = "1", None, STATIC, None, {}
        ns.rdzv_id = None
    ns.elastic = backend != STATIC or ":" in (ns.nnodes or "")
    if ns.elastic and backend == STATIC:
        backend = "c10d"  # a range of nodes: torchrun's elastic rendezvous
    if endpoint:
        host, port = split_endpoint(endpoint, C10D_PORT if ns.elastic else None)
        for flag, given, value in (("--master-addr", ns.master_addr, host), ("--master-port", ns.master_port, port)):
            if given is not None and value is not None and str(given).strip("[]") != str(value).strip("[]"):
                raise RingtrainError(f"--rdzv-endpoint {endpoint} and {flag} {given} disagree: the rendezvous is "
                                     "in one place", f"give only --rdzv-endpoint (or only {flag}).")
        ns.master_addr, ns.master_port = host, port if port is not None else ns.master_port
    ns.rdzv_backend = None if backend == STATIC else backend
    ns.rdzv_conf = conf
    return ns


def passthrough_argv(ns) -> list:
    """The pass-through flags given, as torchrun's parser takes them (``ns``: a Plan's ``torchrun`` dict)."""
    argv = []
    for dest, value in ns.items():
        if value is None or value is False:
            continue
        flag = PASS_THROUGH_DESTS[dest]
        argv += [flag] if value is True else [f"{flag}={value}"]
    return argv


def passthrough_values(ns: argparse.Namespace) -> dict:
    return {flag.dest: getattr(ns, flag.dest, None) for flag in PASS_THROUGH}
