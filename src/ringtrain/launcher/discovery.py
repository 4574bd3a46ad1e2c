"""horovodrun's elastic mode from the command line: ``--min-np``, ``--max-np``, ``--host-discovery-script``,
``--slots-per-host``.

``horovodrun -np 2 --min-np 1 --max-np 4 --host-discovery-script ./discover.sh python train.py``: Horovod
runs the script, which prints the hosts that may run workers (``host`` or ``host:slots`` per line), starts
``-np`` processes or more (up to ``--max-np``, as many as the hosts have slots) once at least
``max(-np, --min-np)`` slots are there, and keeps the job going through failures with ``hvd.elastic.run``.

Here the hosts the script prints when the job starts (asked again every second, up to
``--start-timeout``, until there are enough slots) become the job's nodes, one ``ringtrain run`` agent per
host as with ``-H``, and the agents meet in torchrun's elastic rendezvous (c10d, ``--nnodes MIN:MAX``, MIN
the fewest leading hosts holding ``--min-np`` slots). Inside the job, ``hvd.elastic.run`` recovers from a failed
collective every process survives (ringtrain/horovod/elastic); a worker that dies makes the agents restart
every worker, up to ``--reset-limit`` times (``--max-restarts``), and the script starts again from the top
(from its own checkpoint, if it keeps one). A host that the script starts to print while the job runs is
not added to it (a running job takes no new nodes here).
"""

from __future__ import annotations

import argparse
import subprocess
import time

from ..errors import RingtrainError
from .host_list import Host, assign, parse_host_list, read_hostfile

DEFAULT_START_TIMEOUT = 30  # horovodrun's (HOROVOD_START_TIMEOUT)


def is_elastic(ns: argparse.Namespace) -> bool:
    """horovodrun's rule (launch.py ``_is_elastic``)."""
    return getattr(ns, "host_discovery_script", None) is not None or getattr(ns, "min_np", None) is not None


def parse_hosts(text: str, default_slots: int, script: str) -> list:
    """The script's output: ``host`` or ``host:slots`` per line, blank lines skipped, each host once."""
    found = {}
    for line in (raw.strip() for raw in text.splitlines()):
        if not line:
            continue
        host, sep, slots = line.rpartition(":") if ":" in line else (line, "", "")
        if not sep:
            host, slots = line, str(default_slots)
        if not host or not slots.isdigit() or int(slots) < 1:
            raise RingtrainError(f"--host-discovery-script {script} printed {line!r}, which is not host or host:slots",
                                 "make it print one `host` or `host:N` (N >= 1) per line.")
        found[host] = int(slots)
    return [Host(name, slots) for name, slots in found.items()]


def discover(script: str, default_slots: int, timeout: float) -> list:
    """Run the discovery script once (a shell command, as horovodrun runs it)."""
    try:
        done = subprocess.run(script, shell=True, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RingtrainError(f"--host-discovery-script {script} did not finish within {timeout:g} s",
                             "make it print the hosts and exit; raise --start-timeout if it is slow.") from e
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or [""])[-1]
        raise RingtrainError(f"--host-discovery-script {script} exited with code {done.returncode}"
                             + (f": {detail}" if detail else ""),
                             "run it by hand: it must be executable (chmod +x, a #! line) and print `host:slots` "
                             "lines.")
    return parse_hosts(done.stdout, default_slots, script)


def _enough(ns: argparse.Namespace, needed: int, timeout: float) -> list:
    script = ns.host_discovery_script
    deadline = time.monotonic() + timeout
    while True:
        hosts = discover(script, ns.slots or 1, timeout)
        total = sum(h.slots for h in hosts)
        if total >= needed:
            return hosts
        if time.monotonic() >= deadline:
            listed = ",".join(f"{h.name}:{h.slots}" for h in hosts) or "no host"
            raise RingtrainError(f"--host-discovery-script {script} found {listed} ({total} slot(s)) within "
                                 f"--start-timeout {timeout:g} s; the job needs {needed} process(es)",
                                 "lower -np/--min-np, give the hosts more slots (host:N or --slots-per-host), or "
                                 "raise --start-timeout to wait longer for hosts.")
        time.sleep(1.0)  # horovodrun polls its discovery script too; here only while too few slots exist


def apply(ns: argparse.Namespace) -> argparse.Namespace:
    """An elastic horovodrun command line as a host list (``hosts``, ``np``) and ``elastic_nnodes``."""
    ns = argparse.Namespace(**vars(ns))
    ns.elastic_nnodes = None
    if not is_elastic(ns):
        if getattr(ns, "max_np", None) is not None:
            raise RingtrainError("--max-np without --min-np or --host-discovery-script: not an elastic job",
                                 "add --min-np N (and --host-discovery-script SCRIPT), or drop --max-np.")
        return ns
    if ns.np is None and ns.min_np is None:
        raise RingtrainError("an elastic job needs -np (the processes it starts with) or --min-np",
                             "e.g. -np 2 --min-np 1 --max-np 4 --host-discovery-script ./discover.sh.")
    min_np = ns.min_np if ns.min_np is not None else ns.np
    start_np = ns.np if ns.np is not None else min_np
    max_np = ns.max_np
    if not 1 <= min_np <= start_np or (max_np is not None and max_np < start_np):
        raise RingtrainError(f"--min-np {min_np}, -np {start_np}, --max-np {max_np}: need 1 <= min <= np <= max",
                             "e.g. -np 2 --min-np 1 --max-np 4.")
    for flag, given in (("--nnodes", ns.nnodes), ("--node-rank", ns.node_rank), ("--nproc-per-node", ns.nproc_per_node)):
        if given is not None:
            raise RingtrainError(f"{flag} with an elastic horovodrun command line: the hosts say how many nodes "
                                 "and processes", f"drop {flag}.")
    if ns.host_discovery_script is not None:
        if ns.hosts is not None or ns.hostfile is not None:
            raise RingtrainError("--host-discovery-script with -H/--hostfile", "give the hosts one way only.")
        hosts = _enough(ns, start_np, ns.start_timeout or DEFAULT_START_TIMEOUT)
    elif ns.hosts is None and ns.hostfile is None:
        raise RingtrainError("--min-np needs the hosts: --host-discovery-script SCRIPT or -H/--hostfile",
                             "e.g. --host-discovery-script ./discover.sh (it prints `host:slots` lines).")
    else:
        hosts = parse_host_list(ns.hosts) if ns.hosts is not None else read_hostfile(ns.hostfile)
    total = sum(h.slots for h in hosts)
    chosen = assign(hosts, min(total, max_np) if max_np is not None else total)
    if sum(h.slots for h in chosen) < start_np:
        chosen = assign(hosts, start_np)  # says how many slots are missing
    reach, fewest = 0, len(chosen)
    for i, host in enumerate(chosen):
        reach += host.slots
        if reach >= min_np:
            fewest = i + 1
            break
    ns.hosts, ns.hostfile = ",".join(f"{h.name}:{h.slots}" for h in chosen), None
    ns.np = sum(h.slots for h in chosen)
    ns.elastic_nnodes = f"{fewest}:{len(chosen)}"
    return ns
