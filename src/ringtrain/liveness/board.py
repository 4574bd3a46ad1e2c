"""The job's liveness board: keys in the rendezvous store every launcher already runs.

Under ``ringtrain/live/<generation>/`` (the launcher's restart count and the process group's
formation number: a restarted job never reads the dead attempt's keys):

* ``hello/<r>`` — posted when rank r joins: its pid and host identity;
* ``rank/<r>`` — a ``Post`` (records.py): how rank r left (failed, finished, left);
* ``posted`` (the ranks that posted, appended) and ``count`` (a counter: one round trip polls it);
* ``where/<r>`` — a ``Whereabouts``: where live rank r is, refreshed by its watchdog thread;
* ``stacks`` (a counter: a request for every rank's stack) and ``stack/<n>/<r>`` (rank r's answer
  to request n); ``stall/<key>`` — which rank writes a stall report (the first to claim it).

``ringtrain/live/current`` holds the newest generation, for the launcher's report and
``kill -USR1``. Every method swallows store errors: the board is advice, never a new way to fail.
Once the store's host has gone (its connection closed: the node that hosts it was killed or lost),
the board and its clones stop asking (``lost``): each failed call of the store's C++ client prints
a warning with a C++ stack, and the watchdog would print one twice a second until the rank ends.

Every record (hello, post, whereabouts, stack answer) is sealed with the job's secret (seal.py) and
read back only if its seal is the job's: a post another process forged into the store is ignored
(and named on stderr). The counters (``count``, ``posted``, ``stacks``) are not sealed: they only
say "read again".
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from typing import Any

from . import procs
from .activity import engine_sequence
from .records import Blame, Exit, Post, Whereabouts
from .seal import Seal

PREFIX = "ringtrain/live"
MAX_WORLD = 1 << 20  # more ranks than any job has run (ranks are 32-bit ints; the largest jobs had ~10**5)
_GENERATION = re.compile(r"\d+-\d+")  # "<restart count>-<formation>" (parallel/group.py)


class StoreLost(RuntimeError):
    """The store's host is gone: asked no more (``Board.lost``)."""


class _Reach:
    """Whether the store still answers, shared by a board and its clones (one host, many connections)."""

    def __init__(self) -> None:
        self.lost = False


class _Guarded:
    """A store whose calls stop, with ``StoreLost``, once one of them found the store's host gone."""

    def __init__(self, store: Any, reach: _Reach):
        import torch.distributed as dist

        self._store, self._reach = store, reach
        self._closed = dist.DistNetworkError  # a closed connection; a key's timeout is a DistStoreError

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._reach.lost:
                raise StoreLost("the job's store stopped answering")
            try:
                return method(*args, **kwargs)
            except self._closed:
                self._reach.lost = True
                raise
        return call


class Board:
    """The liveness keys of one process group in the job's store. Never raises on store errors."""

    def __init__(self, store: Any, rank: int, world_size: int, generation: str, seal: Seal | None = None,
                 reach: _Reach | None = None):
        import torch.distributed as dist

        self.rank, self.world_size, self.generation = rank, world_size, generation
        self._reach = reach if reach is not None else _Reach()
        self._plain = store
        self._raw = _Guarded(store, self._reach)
        self.store = _Guarded(dist.PrefixStore(f"{PREFIX}/{generation}", store), self._reach)
        self.seal = seal if seal is not None else Seal.from_environ()
        self.posted: Post | None = None  # what this rank posted, if it did

    @property
    def lost(self) -> bool:
        """Has the store's host gone (a connection to it closed)? Then nothing is read or posted any more."""
        return self._reach.lost

    def clone(self) -> "Board":
        """The same board on a connection of its own (for another thread)."""
        try:
            store = self._plain.clone()
        except (RuntimeError, AttributeError):  # a store type without clone(): share the object
            store = self._plain
        return Board(store, self.rank, self.world_size, self.generation, self.seal, self._reach)

    # --- sealed records (seal.py) -----------------------------------------------------------------
    def _full(self, key: str) -> str:
        return f"{PREFIX}/{self.generation}/{key}"

    def _put(self, key: str, text: str) -> None:
        self.store.set(key, self.seal.seal(self._full(key), text))

    def _open(self, key: str, raw: bytes | str) -> str | None:
        return self.seal.open(self._full(key), raw)

    def _get(self, key: str) -> str | None:
        """The job's record under ``key``; None when there is none or it is not the job's."""
        if not self.store.check([key]):
            return None
        return self._open(key, self.store.get(key))

    # --- joining ------------------------------------------------------------------------------
    def hello(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):
            self._put(f"hello/{self.rank}", json.dumps({"pid": os.getpid(), "host": procs.host_identity(),
                                                         "hostname": socket.gethostname()}))
            self.store.set("world", str(self.world_size))
            self._raw.set(f"{PREFIX}/current", self.generation)

    def hellos_so_far(self) -> dict[int, dict[str, Any]]:
        """The hellos posted so far (the ranks that joined), rank by rank."""
        out = {}
        for r in range(self.world_size):
            with contextlib.suppress(RuntimeError, OSError, ValueError):
                text = self._get(f"hello/{r}")
                if text is not None:
                    out[r] = json.loads(text)
        return out

    def hellos(self) -> dict[int, dict[str, Any]]:
        keys = [f"hello/{r}" for r in range(self.world_size)]
        try:
            if not self.store.check(keys):
                return {}
            texts = [self._open(key, v) for key, v in zip(keys, self.store.multi_get(keys))]
            if any(text is None for text in texts):
                return {}  # a forged hello took a real one's place: not every rank is known
            return {r: json.loads(text) for r, text in enumerate(texts)}
        except (RuntimeError, OSError, ValueError):
            return {}

    # --- leaving --------------------------------------------------------------------------------
    def post(self, state: str, reason: str, *, cause: str = "own", blame: Blame | None = None,
             during: str | None = None) -> Post:
        entry = Post(rank=self.rank, state=state, reason=reason, time=time.time(), pid=os.getpid(), cause=cause,
                     blame=blame, during=during, seq=engine_sequence())
        self.posted = entry
        self._write_post(entry)
        return entry

    def post_exit(self, exit: Exit) -> Post:
        """The agent of ``exit``'s node: post, on that rank's behalf, how its process ended without a word
        (killed by a signal, or an exit status and no post), so that ranks on other machines, which
        cannot see the process, learn it and blame it."""
        blame = exit.as_blame()
        entry = Post(rank=exit.rank, state="failed", reason=blame.reason, time=exit.time, pid=exit.pid,
                     cause="own", blame=blame)
        self._write_post(entry)
        return entry

    def _write_post(self, entry: Post) -> None:
        with contextlib.suppress(RuntimeError, OSError):
            self._put(f"rank/{entry.rank}", entry.to_json())
            self.store.append("posted", f"{entry.rank},")
            self.store.add("count", 1)

    def count(self) -> int:
        """How many posts there are (raises RuntimeError when the store is gone)."""
        return self.store.add("count", 0)

    def read(self) -> dict[int, Post]:
        """Every rank's post so far (the newest per rank)."""
        try:
            if not self.store.check(["posted"]):
                return {}
            listed = sorted({int(r) for r in self.store.get("posted").decode().split(",") if r.isdigit()})
            ranks = [r for r in listed if r < self.world_size]
            if ranks and not self.store.check([f"rank/{r}" for r in ranks]):
                # A rank listed without a post (a forged "posted"): a get would wait for it until the timeout.
                ranks = [r for r in ranks if self.store.check([f"rank/{r}"])]
            if not ranks:
                return {}
            values = self.store.multi_get([f"rank/{r}" for r in ranks])
            out = {}
            for r, value in zip(ranks, values):
                text = self._open(f"rank/{r}", value)
                if text is not None:
                    with contextlib.suppress(ValueError, TypeError):
                        out[r] = Post.from_json(text)
            return out
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
        gone = [rank for rank, pid in neighbours.items() if procs.ended(pid)]
        if not gone:
            return None
        posts = self.read()  # a rank that posted and then exited is not news; one that vanished is
        return next((rank for rank in gone if rank not in posts), None)

    def first_peer_post(self) -> Post | None:
        """The earliest post of another rank that stopped for a reason of its own, else the earliest."""
        peers = [e for r, e in self.read().items() if r != self.rank]
        own = [e for e in peers if e.cause == "own"]
        return min(own or peers, key=lambda e: e.time, default=None)

    # --- where the live ranks are ------------------------------------------------------------
    def publish(self, where: Whereabouts) -> None:
        with contextlib.suppress(RuntimeError, OSError):
            self._put(f"where/{self.rank}", where.to_json())

    def whereabouts(self) -> dict[int, Whereabouts]:
        """Every rank's latest ``Whereabouts`` (ranks that never published are missing)."""
        out: dict[int, Whereabouts] = {}
        try:
            for r in range(self.world_size):
                text = self._get(f"where/{r}")
                if text is not None:
                    out[r] = Whereabouts.from_json(text)
        except (RuntimeError, OSError, ValueError, TypeError):
            pass
        return out

    # --- stacks on request ---------------------------------------------------------------------
    def request_stacks(self, all_threads: bool = False) -> int:
        """Ask every rank for its stack; the request's number (0 when the store is gone). The request is a sealed
        record: the counter alone (a plain store counter anyone who reaches the store can add to) asks nothing."""
        try:
            number = self.store.add("stacks", 1)
            self._put(f"stacks/{number}", "all" if all_threads else "main")
            return number
        except (RuntimeError, OSError):
            return 0

    def stack_requests(self) -> int:
        """The newest request's number (raises RuntimeError when the store is gone)."""
        return self.store.add("stacks", 0)

    def request_kind(self, number: int) -> str | None:
        """``"main"`` or ``"all"``: what request ``number`` asks; None while its record is not there (or is not
        the job's)."""
        with contextlib.suppress(RuntimeError, OSError):
            kind = self._get(f"stacks/{number}")
            return kind if kind in ("main", "all") else None
        return None

    def answer(self, number: int, text: str) -> None:
        with contextlib.suppress(RuntimeError, OSError):
            self._put(f"stack/{number}/{self.rank}", text)

    def answers(self, number: int, ranks: list[int], wait_s: float) -> dict[int, str]:
        """The answers of ``ranks`` to request ``number``, waiting up to ``wait_s`` for them."""
        deadline = time.monotonic() + wait_s
        got: dict[int, str] = {}
        while True:
            for r in ranks:
                if r in got:
                    continue
                with contextlib.suppress(RuntimeError, OSError):
                    text = self._get(f"stack/{number}/{r}")
                    if text is not None:
                        got[r] = text
            if len(got) == len(ranks) or time.monotonic() >= deadline:
                return got
            time.sleep(0.1)

    def claim(self, key: str) -> bool:
        """True for the first rank to claim ``key`` (a stall report: one report, not one per rank)."""
        try:
            # Under a name only the job's ranks can make: a key claimed beforehand by anyone else is another key.
            name = self.seal.name(f"stall/{key}")
            return self.store.compare_set(name, "", str(self.rank)).decode() == str(self.rank)
        except (RuntimeError, OSError):
            return False


def job_board(store: Any = None, master: tuple[str, int] | None = None) -> "Board | None":
    """The newest generation's board of a job, for the launcher (it hosts the store, or reaches ``master``);
    None when no rank has joined a process group yet, or the store cannot be reached."""
    import datetime

    import torch.distributed as dist

    try:
        if store is None:
            if master is None:
                return None
            store = dist.TCPStore(master[0], master[1], is_master=False, timeout=datetime.timedelta(seconds=3),
                                  wait_for_workers=False)
        key = f"{PREFIX}/current"
        if not store.check([key]):
            return None
        generation = store.get(key).decode()
        world = int(store.get(f"{PREFIX}/{generation}/world").decode())
    except (RuntimeError, OSError, ValueError):
        return None
    # Both are plain store values anyone who reaches the store can set: a generation that is no name of ours, or a
    # world too large to be one (the launcher reads every rank's keys), is no board to read.
    if not 1 <= world <= MAX_WORLD or not _GENERATION.fullmatch(generation):
        return None
    return Board(store, -1, world, generation)
