"""What a node says while it waits for its peers, and the true words when it gives up.

torchrun's agents wait for each other in silence: a node started before its peers (or
given a wrong address) printed nothing for up to ``--timeout`` seconds, and its failure
always claimed the timeout had run out, even when the rendezvous failed 0.8 s in (a
refused connection, a name that does not resolve). Here:

* ``reach`` — a node other than node 0 first checks that node 0 answers, saying every
  ``TICK`` seconds why not yet (connection refused: not started?), and fails at once on a
  name that does not resolve.
* ``join_all`` — every node of a fixed-size job adds itself to a counter in node 0's
  store and waits until the counter reaches the node count, with a line every ``TICK``
  seconds: "waiting for 1 of 2 nodes at 127.0.0.1:29500, 20 s of --timeout 300". At the
  timeout it raises ``RendezvousTimeoutError`` naming how many came.
* ``speaking`` — a line every ``TICK`` seconds while a blocking call runs (the store's
  wait, torch's elastic rendezvous). The calls release the GIL, so the thread that
  speaks runs while they block.
* ``SpeakingRendezvous`` — torch's c10d (elastic) rendezvous handler with ``speaking``
  around every round: the first, and each re-forming after a node joins or leaves; a node
  beyond MAX is told it waits as a spare, and told why when the job ends without it.
* ``rendezvous_failure`` — the error for a failed rendezvous: "after --timeout T s" only
  when the wait ran out; otherwise what happened (connection refused, a name that does
  not resolve, a port taken) and when.

Imported by ``execute`` only (it imports torch): ``--help`` and argument errors stay fast.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

from torch.distributed import DistError, DistStoreError, Store
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousTimeoutError,
    rendezvous_handler_registry,
)

from ..errors import RingtrainError

TICK = 10.0  # seconds between two "waiting for ..." lines
ELASTIC = "ringtrain-c10d"  # torch's c10d rendezvous, speaking while it waits


def say(line: str) -> None:
    print(f"ringtrain run: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def speaking(line: Callable[[int], str], *, every: float = TICK, out: Callable[[str], None] = say,
             since: float | None = None) -> Iterator[None]:
    """Run the body; every ``every`` seconds until it ends, ``out(line(seconds since `since`))``."""
    stop = threading.Event()
    start = time.monotonic() if since is None else since

    def run() -> None:
        while not stop.wait(every):
            out(line(round(time.monotonic() - start)))

    thread = threading.Thread(target=run, name="ringtrain-waiting", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def reach(host: str, port: int, *, since: float, timeout: float, every: float = TICK,
          out: Callable[[str], None] = say) -> None:
    """Return once something accepts connections at ``host:port``; say every ``every`` s why not yet.

    Tried from Python before the store's client connects: TCPStore's client retries in C++,
    printing a C++ warning with a stack for every try and running up to three times the
    timeout; here a name that does not resolve fails at once, and the last reason (connection
    refused, no route) is in the words.
    """
    where = f"{host}:{port}"
    said = since
    cause = "no answer yet"
    while True:
        left = timeout - (time.monotonic() - since)
        if left <= 0:
            raise RendezvousTimeoutError(f"node 0 at {where} did not answer within --timeout {timeout:g} s ({cause})")
        try:
            with socket.create_connection((host.strip("[]"), port), timeout=min(left, every)):
                return
        except socket.gaierror as e:
            raise RendezvousConnectionError(f"cannot resolve {host!r}: {e.strerror}") from e
        except OSError as e:
            cause = (e.strerror or str(e) or type(e).__name__).lower()
        now = time.monotonic()
        if now - said >= every:
            out(f"waiting for node 0 at {where} to answer ({cause}), {round(now - since)} s of --timeout {timeout:g}")
            said = now
        time.sleep(min(1.0, max(0.0, timeout - (now - since))))  # the pace of retries, as TCPStore's own


def join_all(store: Store, counter: Store, prefix: str, nodes: int, *, since: float, timeout: float, where: str,
             every: float = TICK, out: Callable[[str], None] = say) -> None:
    """Count this node in under ``prefix``; return once all ``nodes`` have, saying every ``every`` s how many
    are missing. ``counter`` is a second client of the same store, for the thread that speaks (one
    client runs one request at a time, and ``store`` is busy waiting).

    Event-driven: the last node to arrive sets a key the others wait on (``store.wait``).
    """
    joined, complete = f"{prefix}/joined", f"{prefix}/all-joined"
    if store.add(joined, 1) >= nodes:
        store.set(complete, "1")

    def line(seconds: int) -> str:
        try:
            missing = f"{nodes - counter.add(joined, 0)} of {nodes}"
        except DistError:
            missing = f"some of the {nodes}"
        return f"waiting for {missing} nodes at {where}, {seconds} s of --timeout {timeout:g}"

    left = timeout - (time.monotonic() - since)
    with speaking(line, every=every, out=out, since=since):
        try:
            store.wait([complete], timedelta(seconds=max(left, 0.001)))
        except DistStoreError as e:
            if "timeout" not in str(e).lower():
                raise
            raise RendezvousTimeoutError(
                f"{counter.add(joined, 0)} of {nodes} nodes joined within --timeout {timeout:g} s") from e


class SpeakingRendezvous(RendezvousHandler):
    """torch's c10d handler, unchanged, but never silent for more than ``TICK`` seconds in a round.

    A node that joins an elastic job which already has MAX nodes is kept by torch as a spare
    (dynamic_rendezvous.py: the redundancy list, where "the timeout logic" is deliberately not
    applied): it waits past ``--timeout`` until a node leaves, then joins. The lines say so once
    the timeout has passed. If the job ends first, torch's agent returned None there and
    torchrun crashed with "'NoneType' object has no attribute 'is_failed'"; here that exit is a
    ``RendezvousClosedError`` with the reason, which ``rendezvous_failure`` words.
    """

    def __init__(self, inner: RendezvousHandler, where: str, min_nodes: int, max_nodes: int, timeout: float):
        self.inner, self.where, self.timeout = inner, where, timeout
        self.min_nodes, self.max_nodes = min_nodes, max_nodes

    def _line(self, seconds: int) -> str:
        if seconds > self.timeout:
            return (f"still waiting at {self.where} after --timeout {self.timeout:g} s: the elastic job already has "
                    f"its {self.max_nodes} nodes (--nnodes {self.min_nodes}:{self.max_nodes}), so this node waits as "
                    f"a spare and joins when one leaves ({seconds} s so far; Ctrl-C to give up)")
        return (f"waiting for the nodes of the elastic job (--nnodes {self.min_nodes}:{self.max_nodes}: it starts "
                f"with at least {self.min_nodes}) at {self.where}, {seconds} s of --timeout {self.timeout:g}")

    def next_rendezvous(self) -> RendezvousInfo:
        start = time.monotonic()
        with speaking(self._line):
            try:
                return self.inner.next_rendezvous()
            except RendezvousGracefulExitError as e:
                raise RendezvousClosedError(f"the elastic job ended while this node waited to join it ({e})") from e
            except RendezvousError as e:
                if time.monotonic() - start <= self.timeout:
                    raise
                # Past the timeout only a spare still waits (torch times out every other wait):
                # its job ended, and the node that hosted the job's store went with it.
                raise RendezvousClosedError(
                    f"the elastic job ended while this node waited to join it as a spare ({e})") from e

    def get_backend(self) -> str:
        return ELASTIC  # the name it was asked for (torch checks); only logs and events read it

    @property
    def use_agent_store(self) -> bool:
        return self.inner.use_agent_store

    def is_closed(self) -> bool:
        return self.inner.is_closed()

    def set_closed(self) -> None:
        self.inner.set_closed()

    def num_nodes_waiting(self) -> int:
        return self.inner.num_nodes_waiting()

    def get_run_id(self) -> str:
        return self.inner.get_run_id()

    def shutdown(self) -> bool:
        return self.inner.shutdown()


def _create_elastic(params: RendezvousParameters) -> SpeakingRendezvous:
    config = dict(params.config)
    c10d = RendezvousParameters("c10d", params.endpoint, params.run_id, params.min_nodes, params.max_nodes,
                                params.local_addr, **config)
    return SpeakingRendezvous(rendezvous_handler_registry.create_handler(c10d), params.endpoint, params.min_nodes,
                              params.max_nodes, float(config.get("join_timeout", 600)))


def register_elastic() -> None:
    """Make ``--rdzv-backend ringtrain-c10d`` known to torchrun's agent in this process."""
    rendezvous_handler_registry.register(ELASTIC, _create_elastic)  # same creator again: a no-op


# What the first line of an engine error means, in words a user can act on.
_CAUSES = (
    ("connection refused", "nothing listens there (connection refused)"),
    ("name or service not known", "the address does not resolve (no such host name)"),
    ("temporary failure in name resolution", "the address does not resolve (name resolution failed)"),
    ("no address associated", "the address does not resolve (no address for that name)"),
    ("address already in use", "the port is already in use on this machine"),
    ("no route to host", "there is no network route to that host"),
    ("network is unreachable", "that network is unreachable from here"),
    ("broken pipe", "something other than a ringtrain/torch rendezvous answers on that port (broken pipe)"),
    ("connection reset", "something other than a ringtrain/torch rendezvous answers on that port (connection reset)"),
)


def _timed_out(error: BaseException) -> bool:
    if isinstance(error, RendezvousTimeoutError):
        return True
    text = str(error).lower()
    return "timed out" in text or "timeout" in text


def rendezvous_failure(*, node_rank: int, elastic: bool, nnodes: str, max_nodes: int, master_addr: str,
                       port: int, timeout: int, error: BaseException, seconds: float) -> RingtrainError:
    """The error for a rendezvous that failed ``seconds`` after it began, from the engine's ``error``."""
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    where = f"{master_addr}:{port}"
    if node_rank == 0 and not elastic:
        what = f"node 0 waited for the other nodes of {nnodes} at {where} and gave up"
        hint = (f"start `ringtrain run --node-rank R` with the same --nnodes/--master-addr/--master-port on "
                f"the other {max_nodes - 1} node(s) within --timeout ({timeout} s).")
    else:
        what = f"could not join the rendezvous at {where}"
        hint = (f"check that node 0 is running and that {where} is reachable from here "
                f"(`nc -zv {master_addr} {port}`); raise --timeout if node 0 starts later.")
    if isinstance(error, RendezvousClosedError):
        return RingtrainError(
            f"the elastic job at {where} ended (or stopped taking nodes) before this node could join it: "
            f"{first_line}",
            f"an elastic job takes at most MAX nodes (--nnodes {nnodes}); more wait as spares until a node leaves. "
            "To run on more nodes, start the job again with a larger MAX on every node.")
    if _timed_out(error):
        return RingtrainError(f"{what} after --timeout {timeout} s: {first_line}", hint)
    lower = first_line.lower()
    cause = next((words for key, words in _CAUSES if key in lower), None)
    said = f"{cause}: {first_line}" if cause else first_line
    when = f", before --timeout ({timeout} s) ran out" if seconds < timeout else ""
    return RingtrainError(f"the rendezvous at {where} failed {seconds:.1f} s after this node started{when}: {said}", hint)
