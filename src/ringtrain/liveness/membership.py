"""Fail fast: every rank says when it leaves, and a rank left waiting stops within seconds.

A distributed job fails in the most ordinary way — one rank raises — and the others sit in
their next collective until the engine's timeout (30 minutes by default), while the failing
rank's own exit path may wait for them too. This module turns that into a stop in seconds,
naming the rank that caused it; and a job that is stuck rather than dead, into a report of who
waits, who has not arrived, and where.

**The board** (board.py): keys in the job's rendezvous store — each rank's hello, its ``Post``
when it leaves (failed, finished, left), its ``Whereabouts`` while it lives, stack requests and
answers. **The watchdog** (watchdog.py): a daemon thread per rank, on its own store connection,
running a list of checks twice a second — a failed peer ends this rank at once; a finished peer
ends it if it stays blocked in a collective for ``GRACE_S``; a same-host peer whose process is
gone without a post counts as failed; a collective waited in for ``stall_warning`` seconds is
reported with every rank's whereabouts and stacks.

**Exit paths never wait on peers.** An uncaught exception is posted as "failed" by a
``sys.excepthook`` wrapper (the traceback is printed first, as Python would); a collective that
timed out blames the rank that never arrived, not itself. The rest of the exit — the user's
atexit handlers, interpreter finalization — is bounded by
``faulthandler.dump_traceback_later(..., exit=True)``, whose C thread works even while
finalization holds the GIL: an exit that cannot complete in ``EXIT_BOUND_S`` (an engine thread
joined while it waits for a peer) prints every thread's stack and ends the process.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any, Iterator

from ..errors import one_line
from . import dump, failures, procs, stall
from .activity import Activity
from .board import Board
from .records import PREEMPTED, PREEMPTED_EXIT, Blame, Post
from .seal import Seal
from .watchdog import GRACE_S, POLL_S, STALL_WARNING_S, Watchdog, default_checks, vanished_blame  # noqa: F401

__all__ = [
    "Board", "EXIT_BOUND_S", "GRACE_S", "LOST_PEER_WAIT_S", "Membership", "POLL_S",
    "STALL_WARNING_S", "Watchdog", "bound_exit", "bounded", "explain", "has_joined", "leave_process", "lost_a_peer",
    "plain_board", "post_failure", "store_host_lost", "stuck_peer", "timed_out", "vanished_blame",
]

EXIT_BOUND_S = 10.0  # the most an exit path may take once the process has decided to leave
LOST_PEER_WAIT_S = 1.0  # how long a rank whose peer's connection closed looks for who it was
# ... when a peer runs on another host (or in another pid namespace): its death is only known once its
# node's agent has reaped it and posted it (launcher/exits.py), which takes longer than a pid check.
REMOTE_PEER_WAIT_S = 5.0


# --- exit paths -------------------------------------------------------------------------

def bound_exit(seconds: float = EXIT_BOUND_S) -> None:
    """From now on, end this process (stacks dumped, exit 1) if it is still running in ``seconds``."""
    faulthandler.dump_traceback_later(seconds, repeat=False, exit=True)


@contextlib.contextmanager
def bounded(seconds: float = EXIT_BOUND_S) -> Iterator[None]:
    """Run the block under ``bound_exit``; cancel the bound when it returns."""
    bound_exit(seconds)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


class Membership:
    """This process's place on the board, its watchdog and its exit hooks, for one process group."""

    def __init__(self, board: Board, activity: Activity | None = None, *, backward_syncs: bool,
                 error_file: str | None, watch: bool = True, stall_warning: float | None = STALL_WARNING_S,
                 stopping: bool = True, note: str | None = None, preempt_signal: str | None = None,
                 under_agent: bool = False):
        self.board = board
        self.preempt_signal = preempt_signal  # the job's (ringtrain run --preempt-signal): stacks move off SIGUSR1
        self.error_file = error_file
        self.watchdog = Watchdog(board, activity, backward_syncs=backward_syncs, error_file=error_file,
                                 stall_warning=stall_warning, note=note, under_agent=under_agent,
                                 checks=None if stopping else default_checks(stopping=False)) if watch else None
        self._previous_hook: Any = None
        self._armed: dump.Armed | None = None
        self._left = False

    def start(self) -> None:
        global _ACTIVE
        self.board.hello()
        stacks = dump.stack_signal(self.preempt_signal)
        if hasattr(signal, "SIGUSR1") and signal.getsignal(stacks) == signal.SIG_DFL:
            # kill -USR1 <this rank>: its stacks, even while blocked in a collective (plain torchrun too).
            # Only where nobody handles it (Slurm's --signal=USR1 requeue handlers keep theirs).
            with contextlib.suppress(RuntimeError, ValueError):
                faulthandler.register(stacks, all_threads=True, chain=False)
        if self.watchdog is not None:
            self._armed = dump.Armed()  # a stall report on this host can take this rank's stack from outside
            self.watchdog.start()
        self._previous_hook = sys.excepthook
        sys.excepthook = self._excepthook
        _ACTIVE = self

    def _excepthook(self, kind: type, value: BaseException, tb: Any) -> None:
        mine = _ACTIVE is self and not self._left and not issubclass(kind, KeyboardInterrupt)
        # A peer's failure that reached this rank (the engine lost its connection, or it posted first) is said in
        # one line below, not as the engine's traceback (15 lines of Gloo in every restart); the
        # traceback goes to the error file all the same.
        if not (mine and self._a_peer_failed(value)):
            (self._previous_hook or sys.__excepthook__)(kind, value, tb)
        if mine:
            if self.watchdog is not None:
                # Where this rank was is where the error found it: its watchdog says no more while the failure is
                # posted (naming a stuck peer takes seconds), or the last word would be the excepthook's, not the
                # collective it waited in ("in its own backward computation", for a rank whose all-reduce timed out).
                self.watchdog.halt()
            entry = self.fail(one_line(value), value)
            # Now, not at exit: a peer stopped by this post may be gone (and this rank SIGTERMed by
            # torchrun's agent) before this rank's exit path ends; the file is what names it (failures.py).
            callstack = "".join(traceback.format_exception(kind, value, tb))
            failures.write_error_file(self.error_file, entry.reason, callstack, entry.to_dict())
            if entry.blame is not None:
                # Under srun or plain torchrun nobody else reads the board: say here who caused it.
                note = self.watchdog.note if self.watchdog is not None and timed_out(value) else None
                print(f"ringtrain: rank {self.board.rank} stopped because {entry.blame.describe()}; "
                      "the job cannot go on without it." + (f" Its stack:\n{entry.blame.stack}" if entry.blame.stack
                                                            else "") + (f"\n{note}" if note else ""),
                      file=sys.stderr, flush=True)
            elif entry.cause == "peer":  # a peer's connection closed, and nobody could be named
                print(f"ringtrain: rank {self.board.rank} stopped: a peer went away ({one_line(value)})",
                      file=sys.stderr, flush=True)
            bound_exit()  # the atexit handlers and finalization that follow may not wait on peers

    def _a_peer_failed(self, error: BaseException) -> bool:
        """Did ``error`` come from a peer's failure: the engine lost a peer's connection, or a peer failed first?"""
        on = getattr(error, "on_rank", None)
        if on == self.board.rank:
            return False  # it happened on this rank (a save rank 0 could not write), raised on every rank
        if on is not None:
            return True  # raised here for rank `on`'s failure: that rank prints the traceback, not each of the others
        if lost_a_peer(error):
            return True
        first = self.board.first_peer_post()
        return first is not None and first.state in ("failed", "killed", "unreachable")

    def fail(self, reason: str, error: BaseException | None = None) -> Post:
        """Post this rank as failed (its own error, or a consequence of a peer's post) and stop watching."""
        entry = post_failure(self.board, reason, error)
        self.leave()
        return entry

    def finish(self, reason: str) -> Post:
        """Post this rank as finished (unless it already posted) and stop watching."""
        if self.watchdog is not None:
            self.board.publish(self.watchdog.whereabouts())  # its final step times, for the launcher's summary
        entry = self.board.posted or self.board.post("finished", reason)
        self.leave()
        return entry

    def at_exit(self, bound: bool = True) -> None:
        """The interpreter is exiting: say so (state "left": the exit code is not known here) and bound the rest,
        unless ``bound`` is False: the group was destroyed cleanly, so nothing left in the process can wait on a peer,
        and a bound would only turn a slow finalization into exit 1 after a finished job (on a shared 2-core
        machine at a load of 16, tasks of a real `srun -n2` took over 10 s to finalize after `ring.close()`)."""
        if self.board.posted is None:
            self.board.post("left", "process exit")
        self.leave()
        if bound:
            bound_exit()

    def leave(self) -> None:
        global _ACTIVE, _LAST
        _LAST = self
        if self._left:
            return
        self._left = True
        if self.watchdog is not None:
            self.watchdog.halt()
        if self._armed is not None:
            self._armed.close()
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_hook or sys.__excepthook__
        if _ACTIVE is self:
            _ACTIVE = None


# The one deliberate piece of process-wide state in ringtrain: sys.excepthook and the interpreter's exit are the
# process's, so which membership they speak for is too. Read through the functions below.
_ACTIVE: Membership | None = None  # the process group this process is a member of now, if any
_LAST: Membership | None = None  # the membership this process had most recently (kept after it left)


def has_joined() -> bool:
    """Has this process been a member of a process group's board (a ring's, hvd.init's)?"""
    return _ACTIVE is not None or _LAST is not None


def has_left() -> bool:
    """Has this process posted how it leaves (failed, finished, preempted) and stopped watching? A SIGTERM then is
    torchrun's agent stopping it (loop/preempt.py lets it end the process at once)."""
    return _ACTIVE is None and _LAST is not None


def post_failure(board: Board, reason: str, error: BaseException | None = None) -> Post:
    """Post ``reason`` as this rank's failure: caused by a peer when a peer had posted first, when the
    engine says a peer went away (its connection closed), or when a collective timed out waiting for a
    rank that never arrived; then that peer is named if it can be."""
    on_rank = getattr(error, "on_rank", None)  # an error every rank raises for what happened on one (checkpoint/)
    if isinstance(on_rank, int):
        if on_rank != board.rank:
            return board.post("failed", reason, cause="peer", blame=Blame(on_rank, "failed", reason))
        return board.post("failed", reason, cause="own")  # it happened here, whoever posted first
    first = board.first_peer_post()
    if first is None and lost_a_peer(error):
        first = _find_lost_peer(board)
    if first is not None:
        return board.post("failed", reason, cause="peer", blame=first.as_blame())
    if timed_out(error):
        stuck = stuck_peer(board)
        if stuck is not None:
            return board.post("failed", reason, cause="peer", blame=stuck)
    return board.post("failed", reason, cause="peer" if lost_a_peer(error) else "own")


def _find_lost_peer(board: Board, wait_s: float = LOST_PEER_WAIT_S,
                    remote_wait_s: float = REMOTE_PEER_WAIT_S) -> Post | None:
    """The peer whose connection closed: its post (its own, or its agent's), or a same-host peer whose
    process is gone.

    The engine reports a closed connection as soon as the peer's sockets close, which can come
    a moment before the peer's post lands (or before its process is reaped): look a few times,
    for at most ``wait_s`` — ``remote_wait_s`` when some peer runs where this rank cannot see its
    process (another host or pid namespace), whose agent posts its death once it has reaped it.
    Only this failure path waits, never a healthy rank.
    """
    start = time.monotonic()
    deadline = start + wait_s
    neighbours = None
    while True:
        first = board.first_peer_post()
        if first is not None:
            return first
        if board.lost:  # the store went with the peer: the node that hosts it is gone, and nobody can post
            blame = store_host_lost(board.address)
            return Post(rank=blame.rank, state="failed", reason=blame.reason, time=time.time(), blame=blame)
        if neighbours is None:
            neighbours = board.neighbours()
            if neighbours is None or len(neighbours) < board.world_size - 1:
                deadline = start + max(wait_s, remote_wait_s)
        gone = board.vanished(neighbours) if neighbours else None
        if gone is not None:
            blame = vanished_blame(gone)
            return Post(rank=gone, state=blame.state, reason=blame.reason, time=time.time(), blame=blame)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def store_host_lost(address: str | None = None) -> Blame:
    """The blame when a peer's connection and the job's store closed together: the store's host is gone.
    Rank 0 runs there under ``ringtrain run``, torchrun's static rendezvous, srun and ``rt.launch`` (the
    rank number is kept for the records; the words name the store, not a rank: under torchrun's c10d
    rendezvous the store's node need not hold rank 0). ``address``: the store's (``Board.address``), if known."""
    where = f"at {address} " if address else ""
    return Blame(0, "unreachable", f"{where}closed its connections together with a peer: whoever hosts it (node "
                                   "0's ringtrain run or torchrun; rank 0 itself under srun or a plain env:// start) "
                                   "is gone: killed, crashed, or its network lost")


def stuck_peer(board: Board, wait_s: float = 2.0) -> Blame | None:
    """The rank this one's timed-out collective waited for: a live rank that is not in a collective (its
    stack, asked for now), or one that does not answer at all (frozen; its process state where known)."""
    now = time.time()
    views = board.whereabouts()
    me = views.get(board.rank)
    others = [r for r in range(board.world_size) if r != board.rank]
    absent = [r for r in others if not (r in views and views[r].waiting and stall.responding(views[r], now))]
    if not absent:
        return None
    number = board.request_stacks()
    answers = board.answers(number, absent, wait_s) if number else {}
    waited = f" while rank {board.rank} waited in {me.waiting}" if me is not None and me.waiting else ""
    for r in absent:
        view = views.get(r)
        if r in answers and view is not None:
            where = view.doing() + (f" at {view.site}" if view.site else "")
            return Blame(r, "stuck", f"{where}, not in the collective{waited}", answers[r])
    r = absent[0]
    hellos = board.hellos()
    state = ""
    if r in hellos and hellos[r].get("host") == procs.host_identity():
        state = f", process {hellos[r]['pid']}: {procs.state(hellos[r]['pid'])}"
    last = f"; its last word: {views[r].doing()}" if r in views else ""
    return Blame(r, "not responding", f"it did not answer{state}{last}")


_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
# What the engines say when a collective timed out (Gloo: "Timed out waiting 40000ms for recv
# operation to complete"; NCCL's watchdog: "Watchdog caught collective operation timeout").
_TIMED_OUT = ("Timed out waiting", "timed out", "operation timeout", "Timeout")


def lost_a_peer(error: BaseException | None) -> bool:
    """Did ``error`` (or what it was raised from) come from the engine losing a peer's connection?"""
    return _says(error, _PEER_LOST)


def timed_out(error: BaseException | None) -> bool:
    """Did ``error`` (or what it was raised from) come from a collective that timed out?"""
    return _says(error, _TIMED_OUT)


def _says(error: BaseException | None, texts: tuple[str, ...]) -> bool:
    seen = 0
    while error is not None and seen < 10:
        if any(text in str(error) for text in texts):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def leave_process(status: int, reason: str, master: tuple[str, int], rank: int, world_size: int,
                  generation: str, error: BaseException | None = None, *, secret: str | None = None,
                  agent: str | None = None) -> Post | None:
    """A launcher's worker entry, when the user's script is over: post how this rank left; return the post.

    A ring (or hvd.init) posts on its own board; a plain torch.distributed script gets a board
    of its own on the launcher's store, so that peers' reports can name this rank.
    """
    member = _ACTIVE or _LAST
    if member is not None:
        posted = member.board.posted
        preempted = status == PREEMPTED_EXIT and posted and posted.state == "finished" and \
            posted.reason.startswith(PREEMPTED)
        if status and not preempted and not (posted and posted.state == "failed"):
            return member.fail(reason, error)  # e.g. ring.close() and then sys.exit(3)
        return member.finish(reason)  # finish() keeps a post the excepthook already made
    if world_size < 2:
        return None
    # Best effort: the store's host (rank 0's process in an elastic job) may be leaving too, and torch's C++
    # client prints every failed connect with a stack (one run in three of the DDP elastic tutorial's script).
    with native_stderr_quiet():
        board = plain_board(master[0], master[1], rank, world_size, generation, secret=secret, agent=agent)
        if board is None:
            return None
        try:
            return post_failure(board, reason, error) if status else board.post("finished", reason)
        except (RuntimeError, OSError):
            return None


@contextlib.contextmanager
def native_stderr_quiet() -> Iterator[None]:
    """File descriptor 2 to /dev/null for a moment: what native code (torch's store client) writes there is
    dropped; Python's own sys.stderr is flushed first and comes back as it was."""
    sys.stderr.flush()
    saved = quiet = -1
    try:
        saved = os.dup(2)
        quiet = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        if saved >= 0:
            os.close(saved)
        yield
        return
    try:
        os.dup2(quiet, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(quiet)


def explain() -> str | None:
    """Why this rank's collective failed, when the board knows: ``rank 1 finished (process exit)``."""
    if _ACTIVE is None:
        return None
    first = _ACTIVE.board.first_peer_post()
    if first is None:
        return None
    return first.as_blame().describe()


def plain_board(master_addr: str, master_port: int, rank: int, world_size: int, generation: str, *,
                secret: str | None = None, agent: str | None = None) -> Board | None:
    """A board for a plain torch.distributed script (no ring): a fresh client of the launcher's store. It learns the
    job's key from the hellos there once it needs it and they are all there (board.py, ``Board.bind``; this rank's
    must be this process's); until then it seals with the job's secret alone."""
    if not _listening(master_addr, master_port):
        return None
    try:
        import torch.distributed as dist

        store = dist.TCPStore(master_addr, master_port, is_master=False, timeout=datetime.timedelta(seconds=2),
                              wait_for_workers=False)
    except (RuntimeError, OSError, ValueError):
        return None
    return Board(store, rank, world_size, generation, Seal(secret), agent=agent, address=f"{master_addr}:{master_port}")


def _listening(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether anything accepts connections on ``host:port``, asked with one plain connect.

    Nobody may listen there at all: under ``rt.spawn`` a script that formed its group on its own
    ``tcp://`` port never started a store on MASTER_PORT, and after ``destroy_process_group`` rank 0's
    store is gone. A TCPStore client retries such a port for its whole timeout, printing a C++
    trace at each try (80 to 160 lines and seconds at every exit); a refused connect answers at once.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False



