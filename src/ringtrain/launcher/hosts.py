"""horovodrun-style host lists: ``-np N -H host1:2,host2:2`` / ``--hostfile``, one agent per host.

``ringtrain run`` itself runs one node (torchrun's agent). Given a host list it becomes
what ``horovodrun`` is: it starts one ``ringtrain run`` agent per host, all from one
command, with ``--nnodes K --node-rank i --master-addr <node 0> --master-port P`` filled in,
and then supervises them. This file holds the pieces:

* parsing: ``-H a:2,b:2`` (a host without ``:N`` has one slot, as with OpenMPI's ``-H``)
  and hostfiles (``host slots=N`` lines, ``#`` comments, blank lines) — horovodrun's two
  formats (horovod/runner/common/util/hosts.py);
* assignment: ``-np`` processes fill the hosts in order, as horovodrun's
  ``get_host_assignments`` does; node i runs the slots it got (hosts that got none are
  dropped). Nodes may run different numbers of processes: torchelastic assigns global
  ranks by the cumulative sum of every node's ``local_world_size``
  (``SimpleElasticAgent._assign_worker_ranks``), also with a static rendezvous;
* the command for each node: this machine (``localhost``, ``127.0.0.1``, ``::1``, its host
  names and the addresses they resolve to) starts an agent here; every other host gets one
  over ssh (``--ssh-port``, ``--ssh-identity-file`` as horovodrun's). Other loopback
  addresses (``127.0.0.2``) count as other hosts, as with horovodrun, which starts a
  process locally only for an address one of this machine's interfaces has (127.0.0.1 is
  the loopback interface's): that is how a multi-node job is tried over ssh on one machine;
* supervision (``run_nodes``): wait for all, stop the others on the first failure,
  forward SIGINT/SIGTERM — SIGTERM to a node over ssh over a second connection (``node_signal``), so that a
  preemption reaches its agent as it reaches a local one.

Everything but ``run_nodes`` is a pure function of its arguments (the host-name lookups
of ``is_local`` aside), so the ssh commands are tested without ssh.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import RingtrainError
from ..liveness.records import PREEMPTED_EXIT
from ..liveness.seal import new_secret
from ..parallel.contract import ENV
from .host_list import assign, parse_host_list, read_hostfile
from .node_signal import MODULE as NODE_SIGNAL, TOKEN_ENV
from .plan import plan_from_args
from .ports import TORCHRUN_DEFAULT_PORT
from .torchrun_flags import passthrough_argv, passthrough_values

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
# The loopback interface's own addresses: the only loopback addresses that are "here" rather
# than a host to ssh to (horovod/runner/util/network.py get_local_host_addresses lists the
# interfaces' addresses; 127.0.0.2 answers on Linux but is no interface's address).
HERE_ADDRESSES = frozenset({"127.0.0.1", "::1"})

# Variables passed on to remote agents (the remote shell starts from its own login
# environment). Everything else, e.g. PATH, comes from the remote login; the python is
# named by its absolute path, which must be the same on every host.
FORWARDED_NAMES = ("PYTHONPATH", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
FORWARDED_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "HOROVOD_", "RINGTRAIN_")

# ssh without prompts (a password prompt would hang the job unseen), and with a remote
# terminal: when the ssh client is stopped, the remote session is hung up and the remote
# agent gets SIGHUP, which torchelastic handles like SIGTERM (it stops its workers).
# Without -tt a remote job would outlive the launcher that lost track of it.
SSH = ("ssh", "-o", "BatchMode=yes", "-tt")
TERMINATE_TIMEOUT = 20.0  # seconds for the ssh that passes a SIGTERM on to a remote agent (node_signal.py)
# Host keys: learn the key of a host never connected to, refuse one whose key changed
# (OpenSSH >= 7.6, ssh_config(5) StrictHostKeyChecking=accept-new). BatchMode alone refuses
# every new host, so a first job failed until each host was logged into by hand; horovodrun
# turns checking off entirely (StrictHostKeyChecking=no), which also accepts a changed key.
# --ssh-strict-host-keys leaves ssh's own setting (and ~/.ssh/config) in charge instead.
ACCEPT_NEW_HOST_KEYS = ("-o", "StrictHostKeyChecking=accept-new")

SECRET_ENV, SECRET_FILE_ENV = ENV["job_secret"], ENV["job_secret_file"]  # the launcher contract's names


@dataclass(frozen=True)
class Node:
    """One node of the job and the command that starts its agent."""

    host: str
    rank: int
    nproc: int
    local: bool
    argv: list
    # Over ssh: the command that sends its agent SIGTERM (node_signal.py), over a connection of its own.
    terminate_argv: list = field(default_factory=list)


def _is_loopback_literal(name: str) -> bool:
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def is_loopback_name(name: str) -> bool:
    """``localhost`` and loopback addresses: names other machines cannot use to reach this one."""
    return name.lower() in LOOPBACK_NAMES or _is_loopback_literal(name)


def _address(name: str) -> str | None:
    """``name`` as a normalised IP address literal, or None for a host name."""
    try:
        return str(ipaddress.ip_address(name.strip("[]")))
    except ValueError:
        return None


def local_names() -> set:
    """This machine's names, lower case: its host name, short name, fully qualified name, and the
    addresses the host name resolves to (on Debian often 127.0.1.1, from /etc/hosts)."""
    host = socket.gethostname().lower()
    names = {host, host.split(".")[0]}
    try:
        names.add(socket.getfqdn().lower())  # may ask the resolver; called once per launch
        names.update(socket.gethostbyname_ex(host)[2])
    except OSError:
        pass
    return names


def is_local(name: str, names: set | None = None) -> bool:
    """True when ``name`` is this machine, where its agent starts without ssh: ``localhost`` (and its
    aliases), 127.0.0.1, ::1, or one of ``names`` (``local_names()``: host names and their addresses).

    Other loopback addresses, such as 127.0.0.2, are not: they are started over ssh like any other
    host (as horovodrun does), which tries the ssh path of a multi-node job on one machine.
    """
    if name.lower() in LOOPBACK_NAMES:
        return True
    names = local_names() if names is None else names
    address = _address(name)
    if address is not None:
        return address in HERE_ADDRESSES or address in names
    return name.lower() in names


def master_address(nodes: Sequence, given: str | None) -> str:
    """Where the other nodes reach node 0: ``--master-addr``, else 127.0.0.1 when every host is this
    machine, else the first host's name — which must not be a loopback name unless every other host
    is a loopback address too (this machine, reached over ssh)."""
    if given is not None:
        return given
    if all(n.local for n in nodes):
        return "127.0.0.1"
    first = nodes[0].host
    if is_loopback_name(first):
        if all(is_loopback_name(n.host) for n in nodes):  # e.g. -H 127.0.0.1:1,127.0.0.2:1: one machine
            return _address(first) or "127.0.0.1"
        raise RingtrainError(
            f"the first host, {first!r}, is node 0 and hosts the rendezvous, but the other hosts cannot reach "
            "it by that name",
            f"list this machine by a name or address the other hosts reach (e.g. {socket.gethostname()}:N), "
            "or give --master-addr.",
        )
    return first


def forwarded_environment(environ: Mapping) -> dict:
    """The variables handed to remote agents (FORWARDED_NAMES and FORWARDED_PREFIXES), sorted; never the
    job's secret, which would show on the remote command line (``RINGTRAIN_JOB_SECRET_FILE``, a path, goes)."""
    return {k: environ[k] for k in sorted(environ)
            if (k in FORWARDED_NAMES or k.startswith(FORWARDED_PREFIXES)) and k != SECRET_ENV}


def sealing_environment(nodes: Sequence, environ: Mapping) -> dict | None:
    """The environment of the local agents, so that every node seals the board with one secret (seal.py).

    All nodes here: one secret made now, handed to each agent through its environment. Nodes over ssh:
    the user's ``RINGTRAIN_JOB_SECRET_FILE`` reaches them (a path); a ``RINGTRAIN_JOB_SECRET`` would have
    to travel on their command line, which ``ps`` shows to every user there: refused. None: keep ``environ``.
    """
    if all(node.local for node in nodes):
        return None if environ.get(SECRET_ENV) or environ.get(SECRET_FILE_ENV) else \
            {**environ, SECRET_ENV: new_secret()}
    if environ.get(SECRET_ENV):
        raise RingtrainError(
            f"{SECRET_ENV} is set, but it cannot reach the hosts started over ssh without showing on their "
            "command line", f"put the secret in a file every host can read (mode 600) and set "
            f"{SECRET_FILE_ENV}=PATH instead (it is forwarded), or unset {SECRET_ENV}.")
    return None


def agent_argv(python: str, node_rank: int, nnodes: int | str, nproc: int, master_addr: str, master_port: int,
               options: Sequence, target: Sequence) -> list:
    """``python -m ringtrain run`` for one node: its place in the job, then ``options`` and the target.
    ``nnodes`` is a count, or ``MIN:MAX`` for nodes that meet in the elastic rendezvous."""
    return [python, "-m", "ringtrain", "run", "--nnodes", str(nnodes), "--node-rank", str(node_rank),
            "--master-addr", master_addr, "--master-port", str(master_port), "--nproc-per-node", str(nproc),
            *options, *target]


def ssh_options(port: int | None = None, identity_file: str | None = None, strict_host_keys: bool = False) -> list:
    """``ssh -o BatchMode=yes -tt [-o StrictHostKeyChecking=accept-new] [-p PORT] [-i FILE]``: horovodrun's
    --ssh-port / --ssh-identity-file; new host keys learnt unless ``strict_host_keys``."""
    return [*SSH, *(() if strict_host_keys else ACCEPT_NEW_HOST_KEYS), *(["-p", str(port)] if port is not None else []),
            *(["-i", identity_file] if identity_file is not None else [])]


def ssh_argv(host: str, cwd: str, env: Mapping, argv: Sequence, *, port: int | None = None,
             identity_file: str | None = None, strict_host_keys: bool = False) -> list:
    """``ssh -o BatchMode=yes -tt [...] HOST 'cd CWD && env K=V ... ARGV'``, every word shell-quoted."""
    words = [shlex.quote(w) for w in argv]
    if env:
        words = ["env", *(shlex.quote(f"{k}={v}") for k, v in env.items()), *words]
    return [*ssh_options(port, identity_file, strict_host_keys), host,
            f"cd {shlex.quote(cwd)} && exec {' '.join(words)}"]


def plan_nodes(hosts: Sequence, *, master_addr: str | None, master_port: int, options: Sequence,
               target: Sequence, python: str, cwd: str, environ: Mapping, names: set | None = None,
               ssh_port: int | None = None, ssh_identity_file: str | None = None,
               nnodes: str | None = None, ssh_strict_host_keys: bool = False) -> list:
    """One Node per assigned host: a local agent, or the same agent started over ssh (``nnodes``: MIN:MAX for
    an elastic job, else the number of hosts)."""
    names = local_names() if names is None else names
    local = [is_local(h.name, names) for h in hosts]
    draft = [Node(h.name, i, h.slots, loc, []) for i, (h, loc) in enumerate(zip(hosts, local))]
    addr = master_address(draft, master_addr)
    env = forwarded_environment(environ)
    nodes = []
    for node in draft:
        argv = agent_argv(python, node.rank, nnodes or len(draft), node.nproc, addr, master_port, options, target)
        terminate: list = []
        if not node.local:
            ssh = {"port": ssh_port, "identity_file": ssh_identity_file, "strict_host_keys": ssh_strict_host_keys}
            token = secrets.token_hex(8)
            argv = ssh_argv(node.host, cwd, {**env, TOKEN_ENV: token}, argv, **ssh)
            terminate = [word for word in ssh_argv(node.host, cwd, env, [python, "-m", NODE_SIGNAL, token, "TERM"],
                                                   **ssh) if word != "-tt"]
        nodes.append(Node(node.host, node.rank, node.nproc, node.local, argv, terminate))
    return nodes


# ---------------------------------------------------------------------------------------
# From `ringtrain run`'s command line to the nodes' commands.


def agent_options(ns: argparse.Namespace) -> list:
    """The options every node's agent gets from a -H/--hostfile command (the rest is per node)."""
    options = ["--horovod"] if ns.horovod else []
    options += ["--verbose"] if getattr(ns, "verbose", None) else []
    for flag, value in (("--gpus", ns.gpus), ("--max-restarts", ns.max_restarts), ("--log-dir", ns.log_dir),
                        ("--timeout", ns.timeout), ("--timeline", getattr(ns, "timeline", None)),
                        ("--preempt-signal", getattr(ns, "preempt_signal", None)),
                        ("--preempt-grace", getattr(ns, "preempt_grace", None)),
                        ("--rdzv-conf", getattr(ns, "rdzv_conf", None) or None)):
        if value is not None:
            options += [flag, str(value)]
    return options + passthrough_argv(passthrough_values(ns))  # torchrun's own flags, for every agent


def _free_loopback_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def nodes_from_args(ns: argparse.Namespace, *, environ: Mapping | None = None,
                    names: set | None = None, nnodes: str | None = None) -> list:
    """``ringtrain run -H/--hostfile ...``: validate all of it here, then one Node per host.

    Each node's command line is planned (plan.py) before any node starts, so a wrong argument is one
    exit code 2 here, not K failing agents.
    """
    for flag, value in (("--nproc-per-node", ns.nproc_per_node), ("--nnodes", ns.nnodes),
                        ("--node-rank", ns.node_rank)):
        if value is not None:
            raise RingtrainError(f"{flag} with -H/--hostfile: the host list already says how many nodes and "
                                 "processes", f"drop {flag}; give each host its slots (host:N) and the total with -np.")
    if ns.hosts is not None and ns.hostfile is not None:
        raise RingtrainError("both -H and --hostfile were given", "give the hosts one way only.")
    listed = parse_host_list(ns.hosts) if ns.hosts is not None else read_hostfile(ns.hostfile)
    assigned = assign(listed, ns.np)
    for host in assigned:
        plan_from_args(argparse.Namespace(**{**vars(ns), "np": None, "nproc_per_node": str(host.slots),
                                    "nnodes": nnodes or str(len(assigned)), "node_rank": 0}))
    names = local_names() if names is None else names
    port = ns.master_port
    if port is None:
        # All on this machine (loopback addresses reached over ssh included): a free loopback port
        # (node 0's agent binds it a moment later). Across machines every node must know the port
        # in advance: torchrun's default.
        here = all(is_local(h.name, names) or is_loopback_name(h.name) for h in assigned) and ns.master_addr is None
        port = _free_loopback_port() if here else TORCHRUN_DEFAULT_PORT
    ssh_port, identity = _ssh_settings(ns)
    target = ["-m", ns.script] if ns.module else [ns.script]
    nodes = plan_nodes(
        assigned, master_addr=ns.master_addr, master_port=port, options=agent_options(ns),
        target=[*target, *ns.script_args], python=sys.executable, cwd=os.getcwd(),
        environ=os.environ if environ is None else environ, names=names,
        ssh_port=ssh_port, ssh_identity_file=identity, nnodes=nnodes,
        ssh_strict_host_keys=bool(getattr(ns, "ssh_strict_host_keys", False)),
    )
    sealing_environment(nodes, os.environ if environ is None else environ)  # refused before anything starts
    return nodes


def _ssh_settings(ns: argparse.Namespace) -> tuple:
    """``--ssh-port`` and ``--ssh-identity-file``, checked; the identity file as an absolute path."""
    port, identity = getattr(ns, "ssh_port", None), getattr(ns, "ssh_identity_file", None)
    if port is not None and not 1 <= port <= 65535:
        raise RingtrainError(f"--ssh-port {port} is not a TCP port", "use 1..65535 (the hosts' sshd port, 22 by default).")
    if identity is not None:
        if not os.path.isfile(identity):
            raise RingtrainError(f"--ssh-identity-file {identity!r} is not a file",
                                 "give the private key ssh logs in with (e.g. ~/.ssh/id_ed25519), not the .pub.")
        identity = os.path.abspath(identity)
    return port, identity


# ---------------------------------------------------------------------------------------
# Supervision: the only part that starts processes.


def _term_with_parent() -> Callable | None:
    """For local agents: a preexec_fn that has the kernel SIGTERM the agent when this launcher dies.

    SIGTERM rather than SIGKILL so the agent still stops its workers (they die with it too).
    Linux only (prctl(2) PR_SET_PDEATHSIG). prctl is looked up here, in the parent: the
    function that runs between fork and exec only makes the call, so it takes no lock that
    another thread (torch starts one) might have held at the fork.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    sigterm = int(signal.SIGTERM)
    return lambda: prctl(1, sigterm, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG, <linux/prctl.h>


def _code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # -N (killed by signal N) -> 128+N


def _describe(node: Node, code: int) -> str:
    where = f"node {node.rank} ({node.host}{'' if node.local else ', over ssh'})"
    if not node.local and code == 255:
        # The words this node's ssh was started with (-p/-i included), up to the host; ssh_argv's last is the command.
        ssh = " ".join(shlex.quote(w) for w in node.argv[:-1] if w != "-tt")
        strict = "StrictHostKeyChecking=accept-new" not in node.argv
        keys = ("that the host's key is known (with --ssh-strict-host-keys a host never connected to before "
                "fails: connect once with plain ssh to accept its key)" if strict else
                "and, if ssh says the host key changed, that the host really is the one you mean (then remove "
                "the old key with `ssh-keygen -R HOST`)")
        return (f"{where}: ssh failed (exit 255)\nHINT: check that `{ssh} true` works without a password, that "
                f"the host name is right, {keys}.")
    return f"{where} failed with exit code {code}; the other nodes were stopped."


def _terminate_over_ssh(procs: list, nodes: Sequence, say: Callable) -> set:
    """SIGTERM to the agents of the running nodes over ssh, each over a connection of its own (node_signal.py), all
    at once; the nodes it reached. Their ssh clients are left to end with their agents (75 when preempted)."""
    sending = {node.rank: subprocess.Popen(node.terminate_argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
               for proc, node in zip(procs, nodes) if proc.poll() is None and node.terminate_argv}
    reached, deadline = set(), time.monotonic() + TERMINATE_TIMEOUT
    for rank, sender in sending.items():
        try:
            said, _ = sender.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            sender.kill()
            said, _ = sender.communicate()
        if sender.returncode == 0:
            reached.add(rank)
        elif procs[rank].poll() is None:
            say(f"node {rank} ({nodes[rank].host}): SIGTERM over ssh did not reach its agent (exit "
                f"{sender.returncode}: {said.strip()[-300:] or 'no output'}); its session is hung up instead")
    return reached


def _stop(procs: list, nodes: Sequence, sig: int, grace: float, say: Callable = lambda line: None) -> None:
    """``sig`` to the local agents; SIGTERM to the agents over ssh (a preemption: the --preempt-signal too), but
    for a Ctrl-C, which only hangs them up."""
    reached = _terminate_over_ssh(procs, nodes, say) if sig != signal.SIGINT else set()
    for proc, node in zip(procs, nodes):
        if proc.poll() is None and node.rank not in reached:
            # An ssh client stopped with SIGTERM hangs the remote agent up (see SSH): its workers end unsaved.
            proc.send_signal(sig if node.local else signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()  # its workers die with it (PR_SET_PDEATHSIG in worker.py)
            proc.wait()


def _preempted(procs: list, say: Callable) -> int:
    """PREEMPTED_EXIT when every node's agent left preempted (each saved its checkpoint: loop/preempt.py), else 0.
    A node over ssh is preempted like a local one when the SIGTERM reached its agent (``_terminate_over_ssh``)."""
    if procs and all(p.returncode == PREEMPTED_EXIT for p in procs):
        say(f"preempted: every node's ranks saved their checkpoint; exit {PREEMPTED_EXIT}.\nHINT: run the same "
            "command again: it resumes from that checkpoint.")
        return PREEMPTED_EXIT
    return 0


def run_nodes(nodes: Sequence, *, poll: float = 0.1, grace: float = 30.0, preempt_signal: int | None = None,
              say: Callable = lambda line: print(f"ringtrain run: {line}", file=sys.stderr, flush=True)) -> int:
    """Start every node's agent, wait for all; stop the rest when one fails or on SIGINT/SIGTERM (and on
    ``preempt_signal``, --preempt-signal's: passed on as SIGTERM is).

    Returns 0, the first failing node's exit code, PREEMPTED_EXIT when every node saved its preemption
    checkpoint, or 128+N when stopped by signal N. Agents share this process's stdout/stderr; each runs in a
    session of its own, so a Ctrl-C in the terminal reaches them once, forwarded from here.
    """
    received: list = []
    handlers = {s: signal.signal(s, lambda signum, frame: received.append(signum))
                for s in {signal.SIGINT, signal.SIGTERM, *([preempt_signal] if preempt_signal else [])}}
    procs: list = []
    try:
        arm = _term_with_parent()
        env = sealing_environment(nodes, os.environ)
        for node in nodes:
            procs.append(subprocess.Popen(node.argv, stdin=subprocess.DEVNULL, start_new_session=True,
                                          env=env if node.local else None,
                                          preexec_fn=arm if node.local else None))  # noqa: PLW1509 - see above
        while True:
            if received:
                say(f"stopped by {signal.Signals(received[0]).name}; stopping all {len(nodes)} node(s).")
                _stop(procs, nodes, received[0], grace, say)
                return _preempted(procs, say) or 128 + int(received[0])
            codes = [p.poll() for p in procs]
            failed = next(((node, c) for node, c in zip(nodes, codes) if c not in (None, 0)), None)
            if failed is not None:
                _stop(procs, nodes, signal.SIGTERM, grace)  # (a node over ssh that ended meanwhile: no word)
                if _preempted(procs, say):  # a node's ranks were preempted: the others save and leave too
                    return PREEMPTED_EXIT
                say(_describe(failed[0], _code(failed[1])))
                return _code(failed[1])
            if all(c == 0 for c in codes):
                return 0
            time.sleep(poll)
    finally:
        if any(p.poll() is None for p in procs):  # an exception here: leave nothing behind
            _stop(procs, nodes, signal.SIGTERM, grace)
        for s, handler in handlers.items():
            signal.signal(s, handler)
