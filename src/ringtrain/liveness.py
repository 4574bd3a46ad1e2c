"""Fail fast: every rank says when it leaves, and a rank left waiting stops within seconds.

A distributed job fails in the most ordinary way — one rank raises — and the others sit in
their next collective until the engine's timeout (30 minutes by default), while the failing
rank's own exit path may wait for them too. This module turns that into a stop in seconds,
naming the rank that caused it.

**The board.** Keys in the job's rendezvous store (the TCPStore every launcher already runs),
under ``ringtrain/live/<generation>/``:

* ``hello/<r>`` — posted when rank r joins: its pid and host identity;
* ``rank/<r>`` — posted when rank r leaves: ``{"state": "failed" | "finished" | "left",
  "reason", "time", "cause": "own" | "peer", "blame", "during"}``;
* ``posted`` (the ranks that posted, appended) and ``count`` (a counter: one round trip polls it).

The generation is the launcher's restart count and the process group's formation number,
so a restarted job never reads the dead attempt's posts.

**The watchdog.** A daemon thread per rank, on its own store connection (``Store.clone``:
a main thread blocked in a store wait cannot stall it), polls the counter every
``POLL_S``. When a peer has *failed*, the job is lost: it prints one line naming that peer
and its reason, writes the launcher's error file, and ends the process. When a peer has
*finished* (returned, ``ring.close()``, exited), that is an error only if this rank still
waits for it: a rank blocked in a collective (seen from the main thread's stack: a frame of
``torch.distributed``, DDP, or ringtrain's collectives) for ``GRACE_S`` after a peer left is
stopped the same way. A peer on the same host whose process is gone without a post (SIGKILL,
the OOM killer) counts as failed — checked by pid, only within the same pid namespace.

**Exit paths never wait on peers.** An uncaught exception is posted as "failed" by a
``sys.excepthook`` wrapper (the traceback is printed first, as Python would). The rest of
the exit — the user's atexit handlers, interpreter finalization — is bounded by
``faulthandler.dump_traceback_later(..., exit=True)``, whose C thread works even while
finalization holds the GIL: an exit that cannot complete in ``EXIT_BOUND_S`` (an engine
thread joined while it waits for a peer) prints every thread's stack and ends the process.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import json
import os
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable, Iterator

from . import failures

POLL_S = 0.5  # how often the watchdog reads the board
GRACE_S = 3.0  # how long a rank may sit in a collective after a peer finished before it is stopped
EXIT_BOUND_S = 10.0  # the most an exit path may take once the process has decided to leave
STOPPED_EXIT_CODE = 1
LOST_PEER_WAIT_S = 1.0  # how long a rank whose peer's connection closed looks for who it was

_COLLECTIVE_FILES = (
    f"{os.sep}torch{os.sep}distributed{os.sep}",
    f"{os.sep}torch{os.sep}nn{os.sep}parallel{os.sep}distributed.py",
    f"{os.sep}ringtrain{os.sep}comm{os.sep}",
    f"{os.sep}ringtrain{os.sep}collectives.py",
    # a sharded checkpoint: DCP's collectives, or waiting for the writer thread's (whose peers may be gone)
    f"{os.sep}ringtrain{os.sep}sharded.py",
)
_BACKWARD_FILES = (f"{os.sep}torch{os.sep}autograd{os.sep}",)


def host_identity() -> str:
    """This machine and pid namespace: pids are comparable only between equal identities."""
    parts = [socket.gethostname()]
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        with contextlib.suppress(OSError):
            parts.append(open(path).read().strip() if path.endswith("boot_id") else str(os.stat(path).st_ino))
    return "/".join(parts)


def pid_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs here (gone, or a zombie its parent has not reaped yet)."""
    if not failures.process_exists(pid):
        return True
    fields = failures.proc_stat(pid)
    return fields is not None and fields[0] in ("Z", "X")


class Board:
    """The liveness keys of one process group in the job's store. Never raises on store errors."""

    def __init__(self, store: Any, rank: int, world_size: int, generation: str):
        import torch.distributed as dist

        self.rank, self.world_size, self.generation = rank, world_size, generation
        self._raw = store
        self.store = dist.PrefixStore(f"ringtrain/live/{generation}", store)
        self.posted: dict[str, Any] | None = None  # what this rank posted, if it did

    def clone(self) -> "Board":
        """The same board on a connection of its own (for another thread)."""
        try:
            store = self._raw.clone()
        except (RuntimeError, AttributeError):  # a store type without clone(): share the object
            store = self._raw
        return Board(store, self.rank, self.world_size, self.generation)

    def hello(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):
            self.store.set(f"hello/{self.rank}", json.dumps({"pid": os.getpid(), "host": host_identity()}))

    def hellos(self) -> dict[int, dict[str, Any]]:
        keys = [f"hello/{r}" for r in range(self.world_size)]
        try:
            if not self.store.check(keys):
                return {}
            return {r: json.loads(v) for r, v in enumerate(self.store.multi_get(keys))}
        except (RuntimeError, OSError, ValueError):
            return {}

    def post(self, state: str, reason: str, *, cause: str = "own", blame: dict | None = None,
             during: str | None = None) -> dict[str, Any]:
        entry = {"rank": self.rank, "state": state, "reason": reason, "time": time.time(), "pid": os.getpid(),
                 "cause": cause, "blame": blame, "during": during}
        self.posted = entry
        with contextlib.suppress(RuntimeError, OSError):
            self.store.set(f"rank/{self.rank}", json.dumps(entry))
            self.store.append("posted", f"{self.rank},")
            self.store.add("count", 1)
        return entry

    def count(self) -> int:
        """How many posts there are (raises RuntimeError when the store is gone)."""
        return self.store.add("count", 0)

    def read(self) -> dict[int, dict[str, Any]]:
        """Every rank's post so far (the newest per rank)."""
        try:
            if not self.store.check(["posted"]):
                return {}
            ranks = sorted({int(r) for r in self.store.get("posted").decode().split(",") if r})
            values = self.store.multi_get([f"rank/{r}" for r in ranks])
            return {r: json.loads(v) for r, v in zip(ranks, values)}
        except (RuntimeError, OSError, ValueError):
            return {}

    def neighbours(self) -> dict[int, int] | None:
        """Same-host peers that said hello: rank -> pid (None until every rank has said hello)."""
        hellos = self.hellos()
        if not hellos:
            return None
        mine = hellos.get(self.rank, {}).get("host")
        return {r: h["pid"] for r, h in hellos.items() if r != self.rank and h["host"] == mine}

    def vanished(self, neighbours: dict[int, int]) -> int | None:
        """A same-host peer whose process is gone without a post (killed by a signal), if any."""
        gone = [rank for rank, pid in neighbours.items() if pid_gone(pid)]
        if not gone:
            return None
        posts = self.read()  # a rank that posted and then exited is not news; one that vanished is
        return next((rank for rank in gone if rank not in posts), None)

    def first_peer_post(self) -> dict[str, Any] | None:
        """The earliest post of another rank that stopped for a reason of its own, else the earliest."""
        peers = [e for r, e in self.read().items() if r != self.rank]
        own = [e for e in peers if e.get("cause") == "own"]
        return min(own or peers, key=lambda e: e["time"], default=None)


def blame_of(entry: dict[str, Any]) -> dict[str, Any]:
    return {"rank": entry["rank"], "state": entry["state"], "reason": entry["reason"]}


# --- what the main thread is doing ------------------------------------------------------

class Activity:
    """The collective this process's main thread is in, as ringtrain's own layers name it."""

    def __init__(self) -> None:
        self.calls = 0
        self.current: str | None = None

    @contextlib.contextmanager
    def calling(self, what: str) -> Iterator[None]:
        self.calls += 1
        previous, self.current = self.current, f"{what} #{self.calls}"
        try:
            yield
        finally:
            self.current = previous


ACTIVITY = Activity()


def collective_in_progress(backward_syncs: bool) -> str | None:
    """What the main thread is blocked in, if it is a collective; else None."""
    frame = sys._current_frames().get(threading.main_thread().ident)  # documented, for tools like this one
    found = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if any(part in filename for part in _COLLECTIVE_FILES):
            found = frame.f_code.co_name  # keep the outermost: the call the user made
        elif backward_syncs and any(part in filename for part in _BACKWARD_FILES):
            found = "backward (gradient all-reduce)"
        frame = frame.f_back
    if found is None:
        return None
    return ACTIVITY.current or found


# --- the watchdog -----------------------------------------------------------------------

class Watchdog(threading.Thread):
    """See the module docstring. ``stop`` is what ends the process (tests pass their own)."""

    def __init__(self, board: Board, *, backward_syncs: bool, error_file: str | None,
                 interval: float = POLL_S, grace: float = GRACE_S,
                 stop: Callable[[str, dict[str, Any]], None] | None = None):
        super().__init__(name="ringtrain-watchdog", daemon=True)
        self.board = board.clone()
        self.backward_syncs = backward_syncs
        self.error_file = error_file
        self.interval, self.grace = interval, grace
        self._stop_process = stop or self._end_process
        self._halt = threading.Event()
        self._seen = 0
        self._finished: dict[str, Any] | None = None  # a peer that left cleanly
        self._blocked_since: float | None = None
        self._neighbours: dict[int, int] | None = None  # same-host peers: rank -> pid

    def halt(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            verdict = self.check()
            if verdict is not None and not self._halt.is_set():
                self._stop_process(*verdict)
                return

    def check(self) -> tuple[str, dict[str, Any]] | None:
        """One look at the board: (message, error-file info) when this rank must stop, else None."""
        me = self.board.rank
        try:
            count = self.board.count()
        except (RuntimeError, OSError):
            # The store is gone: whoever hosted it (rank 0 without a launcher) has left.
            self._finished = self._finished or {"rank": 0, "state": "left",
                                                "reason": "the job's rendezvous store closed"}
            count = self._seen
        if count > self._seen:
            self._seen = count
            for rank, entry in sorted(self.board.read().items(), key=lambda kv: kv[1]["time"]):
                if rank == me:
                    continue
                if entry["state"] == "failed":  # the job is lost: blame the rank that caused it
                    return self._verdict(entry.get("blame") or blame_of(entry), None)
                self._finished = self._finished or blame_of(entry)
        gone = self._dead_neighbour()
        if gone is not None:
            return self._verdict(vanished_blame(gone), None)
        if self._finished is None:
            return None
        during = collective_in_progress(self.backward_syncs)
        if during is None:
            self._blocked_since = None
            return None
        now = time.monotonic()
        if self._blocked_since is None:
            self._blocked_since = now
        if now - self._blocked_since < self.grace:
            return None
        return self._verdict(self._finished, during)

    def _dead_neighbour(self) -> int | None:
        if self._neighbours is None:
            self._neighbours = self.board.neighbours()
            if self._neighbours is None:
                return None
        return self.board.vanished(self._neighbours)

    def _verdict(self, blame: dict[str, Any], during: str | None) -> tuple[str, dict[str, Any]]:
        me = self.board.rank
        what = failures.describe_blame(blame)
        if during:
            message = f"{what} while rank {me} called {during}"
        else:
            message = f"{what}; the job cannot go on without it"
        info = {"time": time.time(), "cause": "peer", "blame": blame, "during": during}
        self.board.post("failed", f"stopped: {message}", cause="peer", blame=blame, during=during)
        return f"ringtrain: rank {me} stops: {message}.", info

    def _end_process(self, message: str, info: dict[str, Any]) -> None:
        print(message, file=sys.stderr, flush=True)
        failures.write_error_file(self.error_file, message.removeprefix("ringtrain: "), "", info)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        failures.stop_own_processes()
        os._exit(STOPPED_EXIT_CODE)


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

    def __init__(self, board: Board, *, backward_syncs: bool, error_file: str | None, watch: bool = True):
        self.board = board
        self.error_file = error_file
        self.watchdog = Watchdog(board, backward_syncs=backward_syncs, error_file=error_file) if watch else None
        self._previous_hook: Any = None
        self._left = False

    def start(self) -> None:
        global ACTIVE
        self.board.hello()
        if self.watchdog is not None:
            self.watchdog.start()
        self._previous_hook = sys.excepthook
        sys.excepthook = self._excepthook
        ACTIVE = self

    def _excepthook(self, kind: type, value: BaseException, tb: Any) -> None:
        (self._previous_hook or sys.__excepthook__)(kind, value, tb)
        if ACTIVE is self and not self._left and not issubclass(kind, KeyboardInterrupt):
            entry = self.fail(format_exception_line(value), value)
            if entry.get("blame"):
                # Under srun or plain torchrun nobody else reads the board: say here who caused it.
                print(f"ringtrain: rank {self.board.rank} stopped because {failures.describe_blame(entry['blame'])}; "
                      "the job cannot go on without it.", file=sys.stderr, flush=True)
            bound_exit()  # the atexit handlers and finalization that follow may not wait on peers

    def fail(self, reason: str, error: BaseException | None = None) -> dict[str, Any]:
        """Post this rank as failed (its own error, or a consequence of a peer's post) and stop watching."""
        entry = post_failure(self.board, reason, error)
        self.leave()
        return entry

    def finish(self, reason: str) -> dict[str, Any]:
        """Post this rank as finished (unless it already posted) and stop watching."""
        entry = self.board.posted or self.board.post("finished", reason)
        self.leave()
        return entry

    def at_exit(self) -> None:
        """The interpreter is exiting: say so (state "left": the exit code is not known here) and bound the rest."""
        if self.board.posted is None:
            self.board.post("left", "process exit")
        self.leave()
        bound_exit()

    def leave(self) -> None:
        global ACTIVE, LAST
        LAST = self
        if self._left:
            return
        self._left = True
        if self.watchdog is not None:
            self.watchdog.halt()
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_hook or sys.__excepthook__
        if ACTIVE is self:
            ACTIVE = None


ACTIVE: Membership | None = None  # the process group this process is a member of now, if any
LAST: Membership | None = None  # the membership this process had most recently (kept after it left)


def post_failure(board: Board, reason: str, error: BaseException | None = None) -> dict[str, Any]:
    """Post ``reason`` as this rank's failure: caused by a peer when a peer had posted first, or when
    the engine says a peer went away (its connection closed); then the peer is named if it can be."""
    first = board.first_peer_post()
    if first is None and lost_a_peer(error):
        first = _find_lost_peer(board)
    if first is not None:
        return board.post("failed", reason, cause="peer", blame=first.get("blame") or blame_of(first))
    return board.post("failed", reason, cause="peer" if lost_a_peer(error) else "own")


def vanished_blame(rank: int) -> dict[str, Any]:
    return {"rank": rank, "state": "failed", "reason": "its process ended without a word (killed by a signal?)"}


def _find_lost_peer(board: Board, wait_s: float = LOST_PEER_WAIT_S) -> dict[str, Any] | None:
    """The peer whose connection closed: its post, or a same-host peer whose process is gone.

    The engine reports a closed connection as soon as the peer's sockets close, which can come
    a moment before the peer's post lands (or before its process is reaped): look a few times,
    for at most ``wait_s``. Only this failure path waits, never a healthy rank.
    """
    deadline = time.monotonic() + wait_s
    neighbours = None
    while True:
        first = board.first_peer_post()
        if first is not None:
            return first
        neighbours = neighbours if neighbours is not None else board.neighbours()
        gone = board.vanished(neighbours) if neighbours else None
        if gone is not None:
            return {"rank": gone, "blame": vanished_blame(gone)}
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def lost_a_peer(error: BaseException | None) -> bool:
    """Did ``error`` (or what it was raised from) come from the engine losing a peer's connection?"""
    seen = 0
    while error is not None and seen < 10:
        if any(text in str(error) for text in _PEER_LOST):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def leave_process(status: int, reason: str, master: tuple[str, int], rank: int, world_size: int,
                  generation: str, error: BaseException | None = None) -> dict[str, Any] | None:
    """A launcher's worker entry, when the user's script is over: post how this rank left; return the post.

    A ring (or hvd.init) posts on its own board; a plain torch.distributed script gets a board
    of its own on the launcher's store, so that peers' reports can name this rank.
    """
    member = ACTIVE or LAST
    if member is not None:
        posted = member.board.posted
        if status and not (posted and posted["state"] == "failed"):
            return member.fail(reason, error)  # e.g. ring.close() and then sys.exit(3)
        return member.finish(reason)  # finish() keeps a post the excepthook already made
    if world_size < 2:
        return None
    board = plain_board(master[0], master[1], rank, world_size, generation)
    if board is None:
        return None
    return post_failure(board, reason, error) if status else board.post("finished", reason)


def explain() -> str | None:
    """Why this rank's collective failed, when the board knows: ``rank 1 finished (process exit)``."""
    if ACTIVE is None:
        return None
    first = ACTIVE.board.first_peer_post()
    if first is None:
        return None
    return failures.describe_blame(first.get("blame") or blame_of(first))


def plain_board(master_addr: str, master_port: int, rank: int, world_size: int, generation: str) -> Board | None:
    """A board for a plain torch.distributed script (no ring): a fresh client of the launcher's store."""
    try:
        import torch.distributed as dist

        store = dist.TCPStore(master_addr, master_port, is_master=False, timeout=datetime.timedelta(seconds=2),
                              wait_for_workers=False)
    except (RuntimeError, OSError, ValueError):
        return None
    return Board(store, rank, world_size, generation)


def format_exception_line(error: BaseException) -> str:
    """``ValueError: boom`` (first line, at most 500 characters)."""
    return traceback.format_exception_only(type(error), error)[-1].strip().splitlines()[0][:500]
