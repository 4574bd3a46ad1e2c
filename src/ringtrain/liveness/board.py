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

Every record (hello, post, whereabouts, stack answer) is sealed (seal.py) and read back only if its
seal is the job's: a post another process forged into the store is ignored (and named on stderr). The
hellos are sealed with the job's secret, and each holds a nonce its rank drew as it joined (and its
agent's, ``agent``: RINGTRAIN_AGENT_NONCE); every other record is sealed with the job's key, derived from the secret
and all the generation's hellos (``bind``: a rank at formation, once every hello is there; the agent and
a plain script's board when they first need it). A post copied from another job's store or another
attempt's (the same keys, perhaps the same secret) is ignored. Once bound, a board's hellos are the ones
its key came from: a hello written over them later names no pid to look at. The counters (``count``,
``posted``, ``stacks``) are not sealed: they only say "read again".
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import time
from typing import Any

from . import procs
from .activity import engine_sequence
from .records import Blame, Exit, Post, Whereabouts
from .seal import Seal, new_nonce

PREFIX = "ringtrain/live"
MAX_WORLD = 1 << 20  # more ranks than any job has run (ranks are 32-bit ints; the largest jobs had ~10**5)
_GENERATION = re.compile(r"\d+-\d+")  # "<restart count>-<formation>" (parallel/group.py)
# How long a rank that formed its group waits for a hello that is not there (the group formed after every rank
# said hello: only one deleted from the store is missing; the rank then binds without it, heard by nobody).
BIND_WAIT_S = 10.0
_MISSING = "?"  # a hello slot that could not be read, in the job key's identity (a hello is a JSON object)


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


class _Binding:
    """What a board and its clones know of the job's key (``Board.bind``)."""

    def __init__(self) -> None:
        self.own: str | None = None  # this rank's hello, as it wrote it (its nonce drawn once)
        self.seal: Seal | None = None  # the job's seal, once learnt
        self.hellos: dict[int, dict[str, Any]] = {}  # the hellos it was learnt from
        self.refused = False  # the hellos on the store hold nothing this reader knows is fresh (said once)


class Board:
    """The liveness keys of one process group in the job's store. Never raises on store errors."""

    def __init__(self, store: Any, rank: int, world_size: int, generation: str, seal: Seal | None = None,
                 reach: _Reach | None = None, binding: _Binding | None = None, *, agent: str | None = None,
                 address: str | None = None):
        """``seal``: the job's secret's own (None: unsealed); ``agent``: this job's launcher's nonce (its workers'
        hellos carry it; the launcher reads only a board whose hellos do); ``address``: the store's, for reports.
        The launcher contract's settings give all three (whoever makes the board reads them)."""
        import torch.distributed as dist

        self.rank, self.world_size, self.generation = rank, world_size, generation
        self._reach = reach if reach is not None else _Reach()
        self._binding = binding if binding is not None else _Binding()
        self._plain = store
        self._raw = _Guarded(store, self._reach)
        self.store = _Guarded(dist.PrefixStore(f"{PREFIX}/{generation}", store), self._reach)
        self.seal = seal if seal is not None else Seal(None)  # the secret's own: the hellos'
        self.agent, self.address = agent, address
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
        return Board(store, self.rank, self.world_size, self.generation, self.seal, self._reach, self._binding,
                     agent=self.agent, address=self.address)

    # --- sealed records (seal.py) -----------------------------------------------------------------
    def _full(self, key: str) -> str:
        return f"{PREFIX}/{self.generation}/{key}"

    def _job_seal(self) -> Seal:
        """What this board's records (all but the hellos) are sealed with: the job's seal, learnt now if it can be;
        until then the secret's own (a board whose job's hellos are not all there yet: a plain script's)."""
        if self._binding.seal is None and self.seal.active:
            self.bind()
        return self._binding.seal or self.seal

    def _put(self, key: str, text: str) -> None:
        self.store.set(key, self._job_seal().seal(self._full(key), text))

    def _open(self, key: str, raw: bytes | str) -> str | None:
        seal = self._binding.seal
        if seal is None and self.seal.active and Seal.job_of(raw):
            seal = self._job_seal()  # sealed for a job: learn this one's key first, if it can be
        return (seal or self.seal).open(self._full(key), raw)

    def _get(self, key: str) -> str | None:
        """The job's record under ``key``; None when there is none or it is not the job's."""
        if not self.store.check([key]):
            return None
        return self._open(key, self.store.get(key))

    # --- joining ------------------------------------------------------------------------------
    def hello(self) -> None:
        """Say this rank joined: its pid and host, and a nonce of its own (the same words each time it is said)."""
        binding = self._binding
        if binding.own is None:
            hello = {"pid": os.getpid(), "host": procs.host_identity(), "hostname": socket.gethostname(),
                     "nonce": new_nonce()}
            if self.agent:
                hello["agent"] = self.agent
            binding.own = json.dumps(hello)
        with contextlib.suppress(RuntimeError, OSError):
            key = f"hello/{self.rank}"
            self.store.set(key, self.seal.seal(self._full(key), binding.own))
            self.store.set("world", str(self.world_size))
            self._raw.set(f"{PREFIX}/current", self.generation)

    def bind(self, wait_s: float | None = None) -> bool:
        """Learn the job's key from every rank's hello (seal.py, "Bound to the job"); True once it is learnt (or
        there is no secret), False while the hellos are not all there (or are not the job's: ``refused``).

        A rank that said hello puts its own words in its slot, whatever the store holds there. Given ``wait_s``
        (a rank whose group has formed: every hello is there, unless one was deleted) it binds after that wait
        even with a hello missing or not sealed with the secret: its key is then one nobody else holds and what it
        posts goes unheard, rather than any post from elsewhere being heard. A board that said no hello binds only
        to a complete set of genuine hellos that holds something it knows is fresh: its own process's hello (a
        plain script's rank) or its agent's nonce (the launcher), which a set copied from another job lacks."""
        binding = self._binding
        if binding.seal is not None or not self.seal.active:
            return True
        keys = [f"hello/{r}" for r in range(self.world_size)]
        try:
            texts = self._hello_texts(keys, wait_s if binding.own is not None else None)
        except (RuntimeError, OSError):
            return False
        if texts is None:
            return False
        if binding.own is not None:
            texts[self.rank] = binding.own
        elif None in texts or not self._fresh(_parsed(texts)):
            return False
        identity = "\0".join([self._full("hello"), str(self.world_size),
                               *(_MISSING if text is None else text for text in texts)])
        binding.hellos, binding.seal = _parsed(texts), self.seal.for_job(identity)
        return True

    def _hello_texts(self, keys: list[str], wait_s: float | None) -> list[str | None] | None:
        """Every rank's hello opened with the secret (None where it is not sealed with it); None while they are
        not all there. With ``wait_s``: after that long, those that are there (None for the others)."""
        deadline = time.monotonic() + (wait_s or 0.0)
        while not self.store.check(keys):
            if wait_s is None:
                return None
            if time.monotonic() >= deadline:
                present = [key for key in keys if self.store.check([key])]  # one by one: a get would wait for it
                values = dict(zip(present, self.store.multi_get(present) if present else []))
                return [self.seal.open(self._full(key), values[key]) if key in values else None for key in keys]
            time.sleep(0.05)
        return [self.seal.open(self._full(key), value) for key, value in zip(keys, self.store.multi_get(keys))]

    def _fresh(self, hellos: dict[int, dict[str, Any]]) -> bool:
        """Do these hellos hold what this reader knows is of its own job: this process's own hello (a rank's board
        that said none itself), or its agent's nonce (the launcher's)? If not, it says so once."""
        agent = self.agent
        if 0 <= self.rank < self.world_size:
            mine = hellos.get(self.rank, {})
            fresh = mine.get("pid") == os.getpid() and mine.get("host") == procs.host_identity() and \
                (not agent or mine.get("agent") == agent)
            whose = f"rank {self.rank}'s is not this process's"
        else:
            fresh = not agent or any(hello.get("agent") == agent for hello in hellos.values())
            whose = "none is from this launcher's workers"
        if not fresh and not self._binding.refused:
            self._binding.refused = True
            print(f"ringtrain: ignored the hellos on the job's store under {self._full('hello/')!r}: {whose} "
                  "(copied there from another job's store?); the job's board is not read.\nHINT: another process "
                  "that reaches the job's store wrote them; see docs/security.md.", file=sys.stderr,
                  flush=True)
        return fresh

    @property
    def refused(self) -> bool:
        """Were the generation's hellos on the store found to be another job's (``bind``)?"""
        return self._binding.refused

    def hellos_so_far(self) -> dict[int, dict[str, Any]]:
        """The hellos posted so far (the ranks that joined), rank by rank; once bound, those the key came from."""
        if self._binding.seal is not None:
            return dict(self._binding.hellos)
        out = {}
        for r in range(self.world_size):
            with contextlib.suppress(RuntimeError, OSError, ValueError):
                key = f"hello/{r}"
                text = self.seal.open(self._full(key), self.store.get(key)) if self.store.check([key]) else None
                if text is not None:
                    out[r] = json.loads(text)
        return out

    def hellos(self) -> dict[int, dict[str, Any]]:
        """Every rank's hello ({} until every rank's is known); once bound, those the job's key came from."""
        if self._binding.seal is not None:
            hellos = self._binding.hellos
            return dict(hellos) if len(hellos) == self.world_size else {}
        keys = [f"hello/{r}" for r in range(self.world_size)]
        try:
            if not self.store.check(keys):
                return {}
            texts = [self.seal.open(self._full(key), v) for key, v in zip(keys, self.store.multi_get(keys))]
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
            name = self._job_seal().name(f"stall/{key}")
            return self.store.compare_set(name, "", str(self.rank)).decode() == str(self.rank)
        except (RuntimeError, OSError):
            return False


def _parsed(texts: list[str | None]) -> dict[int, dict[str, Any]]:
    """The hellos among ``texts``, by rank (a text that is no JSON object is left out)."""
    out = {}
    for r, text in enumerate(texts):
        with contextlib.suppress(ValueError, TypeError):
            hello = json.loads(text) if text is not None else None
            if isinstance(hello, dict):
                out[r] = hello
    return out


def job_board(store: Any = None, master: tuple[str, int] | None = None, *, secret: str | None = None,
              agent: str | None = None) -> "Board | None":
    """The newest generation's board of a job, for the launcher (it hosts the store, or reaches ``master``);
    None when no rank has joined a process group yet, the store cannot be reached, or the hellos there are
    another job's (``Board.bind``: none holds this launcher's nonce, ``agent``). ``secret``: the job's."""
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
    board = Board(store, -1, world, generation, Seal(secret), agent=agent)
    if not board.bind() and board.refused:
        return None
    return board
