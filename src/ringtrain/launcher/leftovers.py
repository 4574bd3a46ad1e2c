"""What a job's ranks leave running: ``ringtrain run`` adopts its workers' orphans and stops them at the end.

A rank that starts a daemon — a double fork and ``setsid``: a data server, a logger, ``nohup cmd &`` — leaves it
running after the job under torchrun: the daemon is re-parented to init, out of every process group the agent
stops, and nothing says so. ``ringtrain run`` makes itself a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``):
orphans of its workers become its children. When the job is over, each one still running is named (pid and
command line) and stopped — SIGTERM, then SIGKILL after ``GRACE_S`` — as Slurm and Kubernetes stop what a job
leaves behind. Python's multiprocessing helpers of this process are not the job's and are left alone. Elsewhere
(no prctl): nothing is adopted, nothing is stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import time
from typing import Callable

from ..liveness import procs

PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 3.0
_OURS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "from multiprocessing.")


def adopt_orphans() -> bool:
    """Make this process the subreaper of its descendants (Linux); whether it could."""
    name = ctypes.util.find_library("c")
    if not name or not hasattr(os, "getpid"):
        return False
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def stop_leftovers(before: set[int], say: Callable[[str], None]) -> list[int]:
    """Stop this process's children that were not there ``before`` the job (its workers are reaped by now:
    what is left is what they left), each named; returns their pids."""
    left = [pid for pid in procs.children(os.getpid())
            if pid not in before and not any(mark in procs.command_line(pid) for mark in _OURS)]
    if not left:
        return []
    for pid in left:
        say(f"process {pid} ({procs.command_line(pid)[:200] or '?'}), started by the job's workers, was still running "
            "after the job: stopped (SIGTERM)\nHINT: a process that must outlive the job is started outside it (not "
            "from a rank); one the job needs should be ended by the script before it exits.")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    waiting = set(left)
    while waiting and time.monotonic() < deadline:
        for pid in list(waiting):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    waiting.discard(pid)
        time.sleep(0.05)
    for pid in waiting:
        say(f"process {pid} did not end on SIGTERM within {GRACE_S:g} s: SIGKILL")
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return left
