"""A slow link on demand: a private network namespace whose loopback is shaped with ``tc``.

``with shaped_link("1gbit") as link:`` creates a uniquely named namespace
(``ringtrain-<pid>-<n>``), brings its ``lo`` up, shapes it, and always deletes it on the
way out (``finally``; SIGTERM becomes SystemExit while it lives; ``atexit`` as a last
resort; namespaces left by a creator that died are removed by the next one). Processes get
in by ``link.argv(cmd)`` (``ip netns exec NAME cmd...``) or ``with link.entered():`` (this
thread joins the namespace, so everything it starts — ``rt.launch`` ranks, the store it
hosts on 127.0.0.1 — lives there). Nothing but 127.0.0.1 exists inside.

What "the link's rate" means. Every packet between two ranks on one machine crosses the one
loopback, in both directions: a single ``tbf rate 1gbit`` on ``lo`` is a half-duplex
1 Gbit/s wire (measured: a 2-rank all-reduce, which sends both ways at once, tops out at
0.50 Gbit/s bus bandwidth). A real link is full duplex, so RATE here is *per direction of
each connection*: an HTB class per (connection, direction), each at RATE. A classic-BPF
classifier (cls_bpf) picks the class from the TCP ports: the low bit says which direction
(source port above or below destination port, so the two directions of one connection never
share a class) and 7 bits of the source port pick one of 128 pairs of classes. Between two
ranks that is exactly a full-duplex point-to-point link of RATE; with more ranks, two
connections land in the same class with probability 1/128 (then they share RATE), the
price of needing no per-rank address on a 127.0.0.1-only network.

DELAY (optional) is a one-way delay added with netem under every class (round trip: twice).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator, Sequence

from ..errors import RingtrainError
from ..liveness.procs import exists as process_exists

PREFIX = "ringtrain-"
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$")
# tc(8)'s units: *bit are bits per second (SI, 1000), *bps are bytes per second.
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
_DELAY = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
_DELAY_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_PAIRS = 128  # pairs of HTB classes the source port is hashed into (see the module docstring)
_BASE = 0x100  # first class minor: 1:100 .. 1:2ff (hex), 1:1 takes what is not TCP over IPv4
_CLONE_NEWNET = 0x40000000
_MODULE = {"netem": "sch_netem", "htb": "sch_htb", "bpf": "cls_bpf"}  # what each part of the shaping needs
_counter = itertools.count()


@dataclass(frozen=True)
class LinkSpec:
    """A parsed ``RATE[,DELAY]``: ``rate_bps`` bits per second per direction, ``delay_s`` one way."""

    rate: str
    rate_bps: float
    delay: str | None = None
    delay_s: float = 0.0

    def __str__(self) -> str:
        return self.rate + (f",{self.delay}" if self.delay else "")


def parse_link(text: str) -> LinkSpec:
    """``"1gbit"``, ``"10gbit,0.2ms"`` -> LinkSpec; anything else is a RingtrainError with a HINT."""
    parts = [p.strip().lower() for p in str(text).split(",")]
    if not 1 <= len(parts) <= 2 or not parts[0]:
        raise RingtrainError(f"--link {text!r} is not RATE[,DELAY]", "e.g. --link 1gbit or --link 10gbit,0.2ms.")
    rate = _RATE.match(parts[0])
    if not rate or float(rate.group(1)) <= 0:
        raise RingtrainError(f"--link {text!r}: {parts[0]!r} is not a rate",
                             "give a positive number with tc's units: bit, kbit, mbit, gbit, tbit (bits/s) or "
                             "bps, kbps, mbps, gbps (bytes/s), e.g. 100mbit, 1gbit, 10gbit.")
    spec = LinkSpec(parts[0], float(rate.group(1)) * _RATE_UNITS[rate.group(2)])
    if len(parts) == 1:
        return spec
    delay = _DELAY.match(parts[1])
    if not delay or float(delay.group(1)) <= 0 or float(delay.group(1)) * _DELAY_UNITS[delay.group(2)] > 10:
        raise RingtrainError(f"--link {text!r}: {parts[1]!r} is not a delay",
                             "give a one-way delay above 0 and at most 10 s in us, ms or s, e.g. 0.2ms or 5ms.")
    return LinkSpec(spec.rate, spec.rate_bps, parts[1], float(delay.group(1)) * _DELAY_UNITS[delay.group(2)])


class Link:
    """A live shaped namespace: its ``name``, its ``spec``, and ways to run things inside it."""

    def __init__(self, name: str, spec: LinkSpec):
        self.name, self.spec = name, spec

    def argv(self, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run inside the namespace, for subprocess: ``["ip", "netns", "exec", name, *cmd]``."""
        return ["ip", "netns", "exec", self.name, *cmd]

    @contextlib.contextmanager
    def entered(self) -> Iterator[Link]:
        """The calling thread inside the namespace (setns(2)); processes and threads it starts stay there."""
        with open("/proc/thread-self/ns/net") as home, open(f"/run/netns/{self.name}") as target:
            _setns(target.fileno())
            try:
                yield self
            finally:
                _setns(home.fileno())

    def counters(self) -> dict[str, int]:
        """Bytes sent through the shaper so far, per class that saw traffic (``tc -s class show``)."""
        out = _run(["tc", "-n", self.name, "-s", "class", "show", "dev", "lo"], "reading the shaper's counters")
        found = re.findall(r"class htb (\S+) .*?\n\s*Sent (\d+) bytes", out)
        return {cls: int(sent) for cls, sent in found if int(sent)}


def _setns(fd: int) -> None:
    if hasattr(os, "setns"):  # Python >= 3.12
        os.setns(fd, _CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise RingtrainError(f"setns(2) into a network namespace failed: {os.strerror(err)}",
                             "entering a namespace needs CAP_SYS_ADMIN: run as root.")


def _run(cmd: list[str], doing: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        hint = "run as root (creating a network namespace and shaping it needs CAP_NET_ADMIN and CAP_SYS_ADMIN)."
        raise RingtrainError(f"{doing} failed: `{' '.join(cmd)}` said: {' / '.join(why) or done.returncode}", hint)
    return done.stdout


def link_problem() -> str | None:
    """Why a shaped link cannot be made here (not root, no ip or tc), or None; nothing is created."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (iproute2)"
    if os.geteuid() != 0:
        return "not root: a network namespace needs CAP_SYS_ADMIN"
    return None


@lru_cache(maxsize=None)
def link_available(delay: bool = False) -> str | None:
    """None when ``shaped_link`` works here (tried once: a namespace is made and removed), else why not."""
    try:
        with shaped_link("1gbit", "1ms" if delay else None):
            return None
    except RingtrainError as e:
        return e.message


def _bpf_classifier() -> str:
    """Classic BPF for cls_bpf: returns class 1:(BASE + 2*(sport % PAIRS) + (sport > dport)) for
    unfragmented TCP over IPv4, -1 (the filter's flowid, 1:1) for anything else. Offsets are from
    the loopback's (Ethernet-shaped) link header: tc runs classic BPF there on egress."""
    default = 0xFFFFFFFF
    prog = [
        (0x28, 0, 0, 12),                    # 0  ldh [12]            ethertype
        (0x15, 0, 18, 0x0800),               # 1  jeq IPv4 ? next : 20
        (0x30, 0, 0, 23),                    # 2  ldb [23]            IP protocol
        (0x15, 0, 16, 6),                    # 3  jeq TCP ? next : 20
        (0x28, 0, 0, 20),                    # 4  ldh [20]            flags + fragment offset
        (0x45, 14, 0, 0x1FFF),               # 5  jset fragment ? 20 : next
        (0xB1, 0, 0, 14),                    # 6  ldxb 4*([14]&0xf)   X = IP header length
        (0x48, 0, 0, 16),                    # 7  ldh [x+16]          destination port
        (0x02, 0, 0, 0),                     # 8  st M[0]
        (0x48, 0, 0, 14),                    # 9  ldh [x+14]          source port
        (0x61, 0, 0, 0),                     # 10 ldx M[0]            X = destination port
        (0x2D, 0, 4, 0),                     # 11 jgt X ? next : 16
        (0x54, 0, 0, _PAIRS - 1),            # 12 and
        (0x64, 0, 0, 1),                     # 13 lsh 1
        (0x04, 0, 0, 0x10000 + _BASE + 1),   # 14 add 1:(BASE+1)
        (0x16, 0, 0, 0),                     # 15 ret A
        (0x54, 0, 0, _PAIRS - 1),            # 16 and
        (0x64, 0, 0, 1),                     # 17 lsh 1
        (0x04, 0, 0, 0x10000 + _BASE),       # 18 add 1:BASE
        (0x16, 0, 0, 0),                     # 19 ret A
        (0x06, 0, 0, default),               # 20 ret -1: the filter's flowid
    ]
    return f"{len(prog)}," + ",".join(f"{c} {t} {f} {k}" for c, t, f, k in prog)


def _shape(name: str, spec: LinkSpec) -> None:
    rate = f"{spec.rate_bps:.0f}bit"
    # burst: two 64 KiB loopback packets (lo's MTU is 64 KiB), or 1 ms at the rate when larger, so
    # HTB's timer can keep up at 10gbit; quantum: one full packet per round.
    burst = max(2 * 65536 + 1024, int(spec.rate_bps / 8 / 1000))
    lines = ["qdisc add dev lo root handle 1: htb default 1"]
    classes = ["1"] + [f"{_BASE + i:x}" for i in range(2 * _PAIRS)]
    for minor in classes:
        lines.append(f"class add dev lo parent 1: classid 1:{minor} htb rate {rate} ceil {rate} "
                     f"burst {burst} cburst {burst} quantum 66000")
        if spec.delay:
            # limit: packets a delay holds at the rate, with room (netem's default of 1000 throttles fast links).
            limit = max(1000, int(spec.rate_bps * spec.delay_s / 8 / 1500) * 4)
            lines.append(f"qdisc add dev lo parent 1:{minor} netem delay {spec.delay} limit {limit}")
    lines.append(f'filter add dev lo parent 1: protocol all prio 1 bpf bytecode "{_bpf_classifier()}" flowid 1:1')
    done = subprocess.run(["tc", "-n", name, "-batch", "-"], input="\n".join(lines) + "\n", capture_output=True,
                          text=True, timeout=60)
    if done.returncode != 0:
        failed = re.search(r"Command failed -:(\d+)", done.stderr)
        line = lines[int(failed.group(1)) - 1] if failed else " / ".join(lines[:2])
        kind = next((k for k in ("netem", "bpf", "htb") if f" {k} " in f" {line} "), "htb")
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
        hint = "run as root (shaping needs CAP_NET_ADMIN)."
        if "unknown" in why.lower():
            hint = f"this kernel has no {kind}: load it as root with `modprobe {_MODULE[kind]}`" + (
                " (Ubuntu ships it in linux-modules-extra-$(uname -r)), or leave out the delay." if kind == "netem"
                else ".")
        raise RingtrainError(f"shaping the loopback at {spec} failed: `tc {line}` said: {why}", hint)


def _creator(name: str) -> int | None:
    m = re.fullmatch(re.escape(PREFIX) + r"(\d+)-\d+", name)
    return int(m.group(1)) if m else None


def remove_stale() -> list[str]:
    """Delete ``ringtrain-<pid>-<n>`` namespaces whose creator is dead and that hold no process."""
    removed = []
    with contextlib.suppress(OSError):
        for name in os.listdir("/run/netns"):
            pid = _creator(name)
            if pid is None or pid == os.getpid() or process_exists(pid):
                continue
            if subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.strip():
                continue
            if subprocess.run(["ip", "netns", "del", name], capture_output=True).returncode == 0:
                removed.append(name)
    return removed


def _delete(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def _on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def shaped_link(rate: str = "1gbit", delay: str | None = None) -> Iterator[Link]:
    """A fresh namespace whose loopback carries RATE per direction (+ DELAY one way); always deleted."""
    spec = parse_link(rate if delay is None else f"{rate},{delay}")
    problem = link_problem()
    if problem:
        raise RingtrainError(f"a shaped link (--link) was asked for, but {problem}",
                             "run as root on Linux with iproute2 installed (`apt-get install iproute2`), "
                             "or leave out --link.")
    remove_stale()
    name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
    # SIGTERM (a CI runner, `timeout`) would otherwise end the process without running `finally`.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    if main and previous in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _on_sigterm)
    def cleanup() -> None:  # its own function: atexit.unregister drops every registration of one callable
        _delete(name)

    atexit.register(cleanup)
    try:
        _run(["ip", "netns", "add", name], "creating a network namespace")
        _run(["ip", "-n", name, "link", "set", "lo", "up"], "bringing up the namespace's loopback")
        _shape(name, spec)
        yield Link(name, spec)
    finally:
        cleanup()
        atexit.unregister(cleanup)
        if main and previous in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


@contextlib.contextmanager
def inside(link: str | LinkSpec | None) -> Iterator[Link | None]:
    """The calling thread inside a fresh shaped link for the block (``rt.launch`` ranks, the store
    they meet at on 127.0.0.1, all there); for ``None`` a do-nothing block that yields None."""
    if link is None:
        yield None
        return
    spec = link if isinstance(link, LinkSpec) else parse_link(link)
    with shaped_link(spec.rate, spec.delay) as made, made.entered():
        yield made
