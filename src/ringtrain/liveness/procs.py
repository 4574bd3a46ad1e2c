"""Is this process alive? The one answer every part of ringtrain asks (docs/architecture.md, principle 13).

A pid names a process only on one machine, in one boot, in one pid namespace, and only until it
is reused. So a process another process may have to judge later — a checkpoint folder's holder
(checkpoint/lock.py), the writer of a temporary file (checkpoint/temporaries.py), a rank on the
job's board (board.py) — is named by a ``ProcessId``: host, boot id, pid namespace, pid and start
time. ``ProcessId.status()`` says ``alive``, ``gone``, ``rebooted`` (this host since restarted:
every process of that boot has ended) or ``elsewhere`` (another machine or pid namespace, or a
``/proc`` that shows another namespace's processes: it cannot be checked from here, so nothing is
taken from it).

This module is the only reader of ``/proc/<pid>/stat``. It imports nothing of ringtrain and no torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
from dataclasses import dataclass

_STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O", "T": "stopped (SIGSTOP?)",
           "t": "stopped by a debugger", "Z": "a zombie", "X": "dead"}
_START_FIELD = 19  # /proc/PID/stat field 22 (starttime, clock ticks after boot), counted after the name


def stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state, ppid, pgrp, ...); None when
    there is no such process or no /proc. The name may hold spaces and parentheses: split after its last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return raw[raw.rindex(b")") + 2:].decode(errors="replace").split()


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (zombies left out), from /proc; [] where there is none."""
    try:
        entries = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    return [e for e in entries if (fields := stat(e)) is not None and int(fields[1]) == pid and fields[0] != "Z"]


def carrying(name: str, value: str) -> list[int]:
    """The processes here whose environment (as each was started: ``/proc/PID/environ``, readable for one's own
    processes) holds ``name=value`` while their parent's does not: the first process of each tree that
    inherited it. [] where there is no /proc."""
    entry = f"{name}={value}".encode()

    def holds(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                return entry in f.read().split(b"\0")
        except OSError:
            return False

    try:
        pids = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    return [pid for pid in pids if holds(pid) and (fields := stat(pid)) is not None and not holds(int(fields[1]))]


def command_line(pid: int) -> str:
    """``/proc/PID/cmdline`` as one line ("" when unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return " ".join(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except OSError:
        return ""


def exists(pid: int) -> bool:
    """Whether a process ``pid`` exists here (a zombie counts), whoever owns it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's
    return True


def ended(pid: int) -> bool:
    """True when ``pid`` no longer runs here: gone, or a zombie its parent has not reaped yet."""
    if not exists(pid):
        return True
    fields = stat(pid)
    return fields is not None and fields[0] in ("Z", "X")


def state(pid: int) -> str:
    """``running``, ``stopped (SIGSTOP?)``, ``a zombie`` ... from /proc (this host only); ``gone`` or ``unknown``."""
    fields = stat(pid)
    if fields is None:
        return "gone" if not exists(pid) else "unknown"
    return _STATES.get(fields[0], f"state {fields[0]}")


def start_ticks(pid: int) -> str:
    """The process's start time (clock ticks after boot); '' where unknown. With the pid, it names one process."""
    fields = stat(pid)
    return fields[_START_FIELD] if fields is not None and len(fields) > _START_FIELD else ""


def boot_id() -> str:
    """This machine's boot id ('' where unknown): a pid means something only within one boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def pid_namespace() -> str:
    """This process's pid namespace ('' where unknown): `unshare --pid` gives a job pids of its own."""
    with contextlib.suppress(OSError):
        return str(os.stat("/proc/self/ns/pid").st_ino)
    return ""


def proc_is_ours() -> bool:
    """Whether ``/proc`` shows this process's pid namespace. Under ``unshare --pid --fork`` without
    ``--mount-proc`` it is the outer namespace's: a pid of this namespace read there is another process, or none."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return not os.path.isdir("/proc")  # no /proc at all (not Linux): judged by existence alone


def host_identity() -> str:
    """This machine, boot and pid namespace as one string: two pids are comparable only under equal identities."""
    return "/".join(part for part in (socket.gethostname(), boot_id(), pid_namespace()) if part)


def host_hash() -> str:
    """``host_identity`` in 8 hex digits, for names that must be short (temporary files)."""
    return hashlib.sha1(host_identity().encode()).hexdigest()[:8]


@dataclass(frozen=True)
class ProcessId:
    """A process, named so that another process (later, elsewhere) can tell whether it still runs."""

    host: str
    boot: str
    pidns: str
    pid: int
    start: str

    @classmethod
    def me(cls) -> "ProcessId":
        return cls(socket.gethostname(), boot_id(), pid_namespace(), os.getpid(), start_ticks(os.getpid()))

    def status(self) -> str:
        """``alive``, ``gone``, ``rebooted`` or ``elsewhere`` (see the module docstring)."""
        if self.host != socket.gethostname():
            return "elsewhere"
        if self.boot and boot_id() and self.boot != boot_id():
            # This host name, another boot: this machine after a crash or reboot, the common case. (Two
            # machines sharing a host name and a folder would look the same: give them distinct names.)
            return "rebooted"
        if self.pidns and pid_namespace() and self.pidns != pid_namespace():
            return "elsewhere"  # its pid means another process here (or none): nothing to conclude
        if not proc_is_ours():
            return "elsewhere"  # /proc/<its pid> would be another namespace's process (or none)
        fields = stat(self.pid)
        if fields is None:
            if os.path.isdir("/proc"):
                return "gone"
            return "alive" if exists(self.pid) else "gone"  # no /proc (not Linux): existence is all we know
        if fields[0] in ("Z", "X"):
            return "gone"  # a zombie has ended
        if self.start and len(fields) > _START_FIELD and fields[_START_FIELD] != self.start:
            return "gone"  # another start time: another process under a reused pid
        return "alive"

    def same_process(self, other: "ProcessId") -> bool:
        return self == other
