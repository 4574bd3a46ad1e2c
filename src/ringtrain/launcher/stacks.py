"""ringtrain stacks: every rank of a running job prints its Python stack, without stopping the job.

Usage:
    ringtrain stacks [PID]

PID is the ``ringtrain run`` process (``pgrep -f "ringtrain run"``); without it, the one
``ringtrain run`` of this user on this machine. It is ``kill -USR1 PID``: the launcher asks every
rank through the job's store, and each rank's watchdog thread prints the stacks of all its threads
to its stderr (the job's terminal), every line prefixed ``[rank N]`` — the main thread's too, even
while it is blocked in a collective. A rank that does not answer within 3 seconds (frozen, or stuck
in native code holding the GIL) is named with its process state, and if it runs on this machine it
is sent SIGUSR1 itself: Python's faulthandler prints its threads' stacks from a signal handler.

A worker's pid works too (a script under plain torchrun): SIGUSR1 makes it print its own stacks
(faulthandler, registered by ``ringtrain run``'s workers and by every ``rt.Ring``). A job started with
``--preempt-signal USR1`` takes SIGUSR1 as its preemption: its stack request is SIGUSR2, which this command
sends to such a launcher.

Exit status: 0 the signal was sent; 1 no such process, or not one ``ringtrain run`` found; 2 a usage error.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from ..errors import HintingParser
from ..liveness import board as boards, dump, procs
from ..parallel import contract

ANSWER_S = 3.0


def _is_launcher(argv: list[str]) -> bool:
    """``ringtrain run ...``, ``python .../bin/ringtrain run ...`` or ``python -m ringtrain run ...`` (not a
    ``timeout`` or ``nohup`` in front of one, which only carry the words)."""
    for i in range(min(len(argv), 3)):
        if os.path.basename(argv[i]) == "ringtrain" and argv[i + 1:i + 2] == ["run"]:
            return i == 0 or os.path.basename(argv[0]).startswith("python")
        if argv[i:i + 3] == ["-m", "ringtrain", "run"]:
            return os.path.basename(argv[0]).startswith("python")
    return False


def launchers() -> list[int]:
    """The pids of this user's ``ringtrain run`` processes on this machine (from /proc)."""
    found = []
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
        except OSError:
            continue
        if int(entry) != os.getpid() and _is_launcher(argv):
            found.append(int(entry))
    return sorted(found)


def preempt_signal_of(pid: int) -> str | None:
    """The ``--preempt-signal`` a ``ringtrain run`` process was started with (its stack request is then SIGUSR2)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return None
    for i, arg in enumerate(argv):
        if arg in ("--preempt-signal", "--preempt_signal") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(("--preempt-signal=", "--preempt_signal=")):
            return arg.split("=", 1)[1]
    return None


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = HintingParser(prog="ringtrain stacks", description=__doc__.split("\n\n", 1)[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter, usage="ringtrain stacks [PID]")
    parser.add_argument("pid", nargs="?", type=int, help="the ringtrain run process (or a worker)")
    args = parser.parse_args(argv)
    pid = args.pid
    if pid is None:
        found = launchers()
        if len(found) != 1:
            print("ringtrain stacks: " + (f"{len(found)} ringtrain run processes: {', '.join(map(str, found))}" if found
                                          else "no ringtrain run process of yours on this machine")
                  + "\nHINT: give the pid: `ringtrain stacks PID`.", file=sys.stderr)
            return 1
        pid = found[0]
    try:
        os.kill(pid, dump.stack_signal(preempt_signal_of(pid) or ""))
    except ProcessLookupError:
        print(f"ringtrain stacks: no process {pid}\nHINT: `pgrep -f 'ringtrain run'` lists the launchers.",
              file=sys.stderr)
        return 1
    except PermissionError:
        print(f"ringtrain stacks: process {pid} is not yours\nHINT: run it as the job's user.", file=sys.stderr)
        return 1
    print(f"ringtrain stacks: asked process {pid}; the stacks appear in that job's output.")
    return 0


class StackRequests:
    """``ringtrain run``'s SIGUSR1 (SIGUSR2 under ``--preempt-signal USR1``): ask every rank of the running job for its stacks, through the store.

    The handler only notes the request (a signal handler must not block); a thread does the asking,
    waits for the answers and names (and signals) the ranks that do not answer.
    """

    def __init__(self, master: tuple[str, int], store: Any = None, settings: contract.Settings | None = None):
        self.master, self.store = master, store
        self.settings = contract.Settings() if settings is None else settings  # the job's (the workers' too)
        self._previous: Any = None
        # SIGUSR2 where SIGUSR1 preempts the job (--preempt-signal USR1)
        self.signum = dump.stack_signal(self.settings.preempt_signal)

    def install(self) -> None:
        if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(self.signum, self._handle)

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(self.signum, self._previous)

    def _handle(self, signum: int, frame: Any) -> None:
        threading.Thread(target=self.ask, name="ringtrain-stacks", daemon=True).start()

    def ask(self) -> None:
        board = boards.job_board(self.store, self.master, secret=self.settings.job_secret,
                                 agent=self.settings.agent_nonce)
        if board is None:
            print("ringtrain run: stacks: no rank has joined a process group yet; nothing to ask.", file=sys.stderr,
                  flush=True)
            return
        number = board.request_stacks(all_threads=True)
        hellos = board.hellos_so_far()
        answers = board.answers(number, sorted(hellos), ANSWER_S)
        here = procs.host_identity()
        for rank in sorted(set(hellos) - set(answers)):
            hello = hellos[rank]
            where = f"pid {hello.get('pid')} on {hello.get('hostname', '?')}"
            if hello.get("host") == here:
                state = procs.state(hello["pid"])
                print(f"ringtrain run: stacks: rank {rank} did not answer ({where}: {state}); Python's faulthandler "
                      "prints its threads' stacks below, from a signal handler.", file=sys.stderr, flush=True)
                try:
                    os.kill(hello["pid"], self.signum)
                except OSError:
                    pass
            else:
                print(f"ringtrain run: stacks: rank {rank} did not answer ({where}).", file=sys.stderr, flush=True)

