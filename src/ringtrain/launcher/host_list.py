"""horovodrun's host lists: ``-H host1:N1,host2:N2`` and ``--hostfile`` lines (``host slots=N``), read and
checked, and ``-np`` processes assigned to their slots in order (as horovodrun's ``get_host_assignments``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import RingtrainError


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


def _slots(text: str, where: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise RingtrainError(f"{where}: slots {text!r} is not a positive number", "write e.g. host1:2 (-H) or "
                             "`host1 slots=2` (hostfile): a positive number of processes for that host.")
    return int(text)


def _host_name(name: str, where: str) -> str:
    # A leading "-" would reach ssh as an option (-oProxyCommand=...), not as a host.
    if not name or name.startswith("-") or any(c.isspace() or c in ",'\"" for c in name):
        raise RingtrainError(f"{where}: {name!r} is not a host name", "use host names or IP addresses, e.g. "
                             "-H node1:4,node2:4 or -H localhost:2.")
    return name


def parse_host_list(text: str) -> list:
    """``-H`` / ``--hosts``: ``host[:slots],...``; IPv6 addresses in brackets (``[::1]:2``)."""
    hosts = []
    for item in text.split(","):
        item = item.strip()
        where = f"-H {text!r}"
        if item.startswith("["):  # [v6addr] or [v6addr]:slots
            match = re.fullmatch(r"\[([^\]]+)\](?::(.*))?", item)
            if not match:
                raise RingtrainError(f"{where}: cannot read {item!r}", "write IPv6 addresses as [::1]:2.")
            name, slots = match.group(1), match.group(2) if match.group(2) is not None else "1"
        elif item.count(":") > 1:
            raise RingtrainError(f"{where}: {item!r} is ambiguous (an IPv6 address, or address:slots?)",
                                 "put IPv6 addresses in brackets: -H [::1]:2.")
        else:
            name, _, slots = item.partition(":")
            slots = slots if ":" in item else "1"
        hosts.append(Host(_host_name(name, where), _slots(slots, where)))
    return _no_duplicates(hosts, f"-H {text!r}")


def parse_hostfile_text(text: str, source: str = "hostfile") -> list:
    """A hostfile's lines: ``host slots=N`` (or just ``host``: one slot); ``#`` starts a comment."""
    hosts = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{source}, line {number}"
        slots = "1"
        for word in words[1:]:
            key, eq, value = word.partition("=")
            if key != "slots" or not eq:
                raise RingtrainError(f"{where}: cannot read {line.strip()!r}",
                                     "each line is `hostname slots=N` (blank lines and # comments are skipped).")
            slots = value
        hosts.append(Host(_host_name(words[0].strip("[]"), where), _slots(slots, where)))
    if not hosts:
        raise RingtrainError(f"{source} lists no hosts", "add lines such as `node1 slots=4`.")
    return _no_duplicates(hosts, source)


def read_hostfile(path: str) -> list:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise RingtrainError(f"--hostfile {path!r}: cannot read it ({e.strerror})",
                             "give the path of a file with lines like `node1 slots=4`.") from e
    return parse_hostfile_text(text, f"--hostfile {path!r}")


def _no_duplicates(hosts: list, source: str) -> list:
    seen = set()
    for host in hosts:
        key = host.name.lower()
        if key in seen:
            raise RingtrainError(f"{source}: host {host.name!r} is listed twice",
                                 "list each host once with all its slots (e.g. node1:4).")
        seen.add(key)
    return hosts


def assign(hosts: Sequence, np: int | None) -> list:
    """The hosts that get processes and how many each: ``np`` fill the slots in host order."""
    total = sum(h.slots for h in hosts)
    if np is None:
        return list(hosts)  # -np omitted: every slot
    if np < 1:
        raise RingtrainError(f"-np {np}: a job needs at least one process", "use -np 1 or more.")
    if np > total:
        listed = ",".join(f"{h.name}:{h.slots}" for h in hosts)
        raise RingtrainError(f"-np {np} processes, but the hosts ({listed}) have only {total} slot(s)",
                             f"lower -np to {total} or less, or give the hosts more slots (host:N).")
    out, left = [], np
    for host in hosts:
        if left == 0:
            break
        out.append(Host(host.name, min(host.slots, left)))
        left -= out[-1].slots
    return out
