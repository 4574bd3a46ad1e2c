"""A node's agent tells the whole job how its workers died.

A rank killed by a signal (SIGKILL from the OOM killer, a segfault) posts nothing. A peer on the
same machine sees its pid vanish (watchdog.VanishedNeighbour); a peer on another machine — or in
another pid namespace, as a container is — cannot: it only sees its connection close, and without a
word on the board it blamed itself ("worker rank 1 failed first ... fix the exception above").

The one process that knows is the dead worker's parent, this node's agent (``ringtrain run``):
torchelastic reaps the worker and reports its exit status. ``tell_job`` posts it on the job's board
on the dead rank's behalf (``Board.post_exit``: rank, pid, host, signal or status), sealed like every
post; peers on every node read it within their next look (``liveness._find_lost_peer`` waits for it a
little longer when a peer is on another host), stop naming that rank, and every node's report blames
it. A rank that posted for itself keeps its own post; a rank the agent stopped itself (SIGTERM, after
another failure) is not the cause and is not posted.

Node 0's agent hosts the store: if it left at once, the other nodes could no longer read what it
posted. ``hold_store`` keeps it until every rank of the other nodes has posted how it left, or
``HOLD_S`` — a bounded wait on the failure path of the store's host only; ranks never wait here.

Which SIGTERMs were the agent's own is known, not guessed: ``Stops`` notes every signal torchrun's agent sends a
worker itself (after another worker ended, when the agent is signalled, SIGKILL after ``--shutdown-timeout``). A
worker that died by SIGTERM and is not among them was signalled from outside — ``kill PID`` to that worker, not to
ringtrain run: it is the cause (before, whichever rank torchrun reaped first was taken for it: rank 0 "failed first"
in 2 runs of 5), and it is posted like a kill.

Only jobs with fixed node counts, and under ``--max-restarts`` only the last attempt (the one that ends
the job): its board is in that attempt's own store, which node 0 keeps open for this
(``rendezvous.workers_store``). A death that only causes a restart is not posted (torch's agent
restarts its workers without handing the exits out); the other nodes' ranks of that attempt see
their connection close and restart with it. An elastic job's store lives in rank 0's worker itself.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Any, Callable

from ..liveness import procs
from ..liveness.failures import info_of
from ..liveness.records import Exit, Post

HOLD_S = 5.0  # the most node 0's agent keeps the store up for the other nodes after a failure


class Stops:
    """What this node's agent did to its workers, for the report: the signals it sent each one itself (by pid, in
    order: SIGTERM, then SIGKILL after ``grace``, torchrun's ``--shutdown-timeout``), and — when a signal reached
    the agent (``signalled``) — when, and the state each worker's process was in then (a stopped process answers
    no signal). ``watch`` wraps torchrun's ``SubprocessHandler.close``, the one call its agent stops a worker with."""

    def __init__(self, grace: float | None = None) -> None:
        self.grace = grace
        self.sent: dict[int, list[str]] = {}
        self.signalled_at: float | None = None
        self.states: dict[int, str] = {}

    def by_agent(self, pid: int) -> bool:
        """Did the agent signal this worker itself?"""
        return pid in self.sent

    def killed_after_grace(self, pid: int) -> bool:
        return "SIGKILL" in self.sent.get(pid, [])

    def signalled(self) -> None:
        """A signal reached the agent (before it passes it on): the time, and its workers' process states now."""
        self.signalled_at = time.time()
        self.states = {pid: procs.state(pid) for pid in procs.children(os.getpid())}

    def watch(self) -> Callable[[], None]:
        """Note the signals torchrun's agent sends its workers; returns what puts its code back. A torch without
        the class notes nothing (the report then takes every SIGTERM for the agent's, as before)."""
        try:  # torch once a job starts (fast --help)
            from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler as module
        except ImportError:
            return lambda: None
        handler = getattr(module, "SubprocessHandler", None)
        original = getattr(handler, "close", None)
        if original is None:
            return lambda: None
        stops = self

        def close(self: Any, death_sig: Any = None) -> None:
            with_signal = death_sig if death_sig is not None else signal.SIGTERM
            stops.sent.setdefault(self.proc.pid, []).append(signal.Signals(with_signal).name)
            return original(self, death_sig)

        handler.close = close

        def restore() -> None:
            handler.close = original

        return restore


def unspoken(failures: dict[int, Any], cause: int, stops: Stops | None = None) -> list[Exit]:
    """The exits of this node's workers that left no word (no post in their error file, failures.py): every
    one but those the agent stopped itself — known from ``stops``, else taken to be every SIGTERM but
    ``cause``'s."""
    now, hostname = time.time(), socket.gethostname()
    out = []
    for rank, failure in sorted(failures.items()):
        by_agent = stops.by_agent(failure.pid) if stops is not None else \
            (failure.exitcode == -signal.SIGTERM and rank != cause)
        if info_of(failure.message) is not None or failure.exitcode == 0 or by_agent:
            continue
        out.append(Exit(rank=rank, pid=failure.pid, hostname=hostname, exitcode=failure.exitcode, time=now))
    return out


def tell_job(board: Any, silent: list[Exit]) -> list[Post]:
    """Post the ``silent`` exits on ``board`` (unless the rank posted there after all); the posts made."""
    if board is None or not silent:
        return []
    posted = board.read()
    return [board.post_exit(exit) for exit in silent if exit.rank not in posted]


def hold_store(board: Any, local_ranks: set[int], wait_s: float = HOLD_S, poll_s: float = 0.1) -> None:
    """Node 0 after a failure: return once every rank not in ``local_ranks`` has posted, or after ``wait_s``."""
    if board is None:
        return
    others = set(range(board.world_size)) - set(local_ranks)
    deadline = time.monotonic() + wait_s
    while others - set(board.read()) and time.monotonic() < deadline:
        time.sleep(poll_s)
