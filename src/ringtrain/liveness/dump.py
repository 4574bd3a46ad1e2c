"""A rank's Python stack taken from outside, when its own watchdog cannot answer.

A rank that holds the GIL in native code, or is stuck in a C call that never returns, cannot run its watchdog
thread: it does not answer a stall report's request for its stack, and its last published whereabouts may be
many steps old. Every member of a group registers ``faulthandler`` on a signal of its own here (``arm``), writing
to a file named by its pid; a stall report on the same host sends that signal and reads what was written
(``take``). faulthandler's handler runs in C without the GIL, so the stack is where the rank is *now*. A
stopped process (SIGSTOP) gets the signal when it continues: nothing comes back, and the report says it is
stopped. Linux only (a real-time signal); elsewhere nothing is armed and nothing is taken.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import tempfile
import time
from typing import IO

SIGNAL = signal.SIGRTMIN + 4 if hasattr(signal, "SIGRTMIN") else None  # glibc keeps SIGRTMIN and +1 for itself


def stack_signal(preempt: str | None) -> int:
    """The signal a person sends for stacks (``ringtrain stacks``, ``kill -USR1``): SIGUSR1, or SIGUSR2 where
    SIGUSR1 is the job's preemption signal (``--preempt-signal USR1``, as Slurm's ``--signal=USR1@90``).
    ``preempt``: that signal's name (the launcher contract's ``Settings.preempt_signal``), or None."""
    name = ("" if preempt is None else str(preempt)).strip().upper()
    usr1 = name in ("USR1", "SIGUSR1") or (name.isdigit() and int(name) == signal.SIGUSR1)
    return int(signal.SIGUSR2 if usr1 else signal.SIGUSR1)


def path(pid: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"ringtrain-stack-{pid}.txt")


class Armed:
    """This process answers ``take`` (one per process; ``close`` at leave)."""

    def __init__(self) -> None:
        self.file: IO | None = None
        if SIGNAL is None:
            return
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            self.file = open(path(os.getpid()), "a")  # noqa: SIM115 - faulthandler keeps writing to it
            faulthandler.register(SIGNAL, file=self.file, all_threads=True, chain=False)

    def close(self) -> None:
        if self.file is None:
            return
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            faulthandler.unregister(SIGNAL)
            self.file.close()
            os.unlink(self.file.name)
        self.file = None


def take(pid: int, wait_s: float = 1.0) -> str | None:
    """The stack of process ``pid`` on this host, now, or None (not armed, stopped, or gone)."""
    if SIGNAL is None or not os.path.exists(path(pid)):
        return None
    try:
        before = os.path.getsize(path(pid))
        os.kill(pid, SIGNAL)
    except OSError:
        return None
    deadline, size = time.monotonic() + wait_s, before
    while time.monotonic() < deadline:
        time.sleep(0.05)
        with contextlib.suppress(OSError):
            now = os.path.getsize(path(pid))
            if now > before and now == size:  # grown, and no longer growing
                with open(path(pid)) as f:
                    f.seek(before)
                    return f.read().strip() or None
            size = now
    return None
