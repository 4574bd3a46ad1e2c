"""torchrun's static rendezvous, with an empty store for the workers of every restart.

Why not torchrun's own ``static`` backend: its agent keeps one TCPStore for the whole
run, and restarted workers join that same store (``TORCHELASTIC_USE_AGENT_STORE``;
torch/distributed/rendezvous.py assumes otherwise: "We create a new TCPStore for every
retry so no need to add prefix for each attempt"). Nothing does, so the
keys the previous attempt's workers wrote are still there: a restarted rank can read
its peer's Gloo address (or NCCL id) of the dead attempt and fail with
"connectFullMesh failed ... Connection refused". Seen here in torch 2.13 with the
``static`` backend (ringtrain's restart test, plain ``torchrun --max-restarts 1`` now and
then) and with ``c10d`` (plain ``torchrun --standalone``, every time); the shared-store
variant is https://github.com/pytorch/pytorch/issues/135712. For elastic jobs (c10d),
``ringtrain run`` turns the sharing off instead (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``).

So this handler (registered as the ``ringtrain`` backend, used by ``ringtrain run`` for
fixed node counts) behaves like ``static`` — fixed node ranks, node 0 hosts the store
on ``--master-port``, the other nodes wait for it up to ``--timeout`` — except that

* attempt 0's workers get ``MASTER_PORT = --master-port`` as with torchrun, and each
  restart's workers a new, empty store that node 0 hosts on a free port (on loopback
  when the job is on one machine), published to the other nodes through the main
  store; the previous attempt's store is closed;
* the agents' own keys for an attempt live under their own prefix, so nothing of a
  dead attempt is ever read back;
* while a node waits for the others it says so every 10 s, naming how many are missing
  (waiting.py), and the nodes count each other in the store instead of node 0 blocking
  silently in the store's constructor.

The newest attempt's store outlives the agent's ``shutdown``: node 0 keeps it open (and every node
knows its port) until ``ringtrain run`` ends, so that after the last attempt fails the agent can still
post its workers' silent deaths there for the ranks of the other nodes (``workers_store``, exits.py).

The agents of all nodes count attempts the same way (every restart is a new round on
every node: a worker that dies takes its peers' collectives down with it); should they
ever disagree, a node waits for the other's store port up to ``--timeout`` and fails
with a rendezvous error rather than joining a stale attempt.

Imported by ``execute`` only (it imports torch): ``--help`` and argument errors stay fast.
"""

from __future__ import annotations

import time
from datetime import timedelta

from torch.distributed import PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from .ports import host_store
from .waiting import join_all, reach

BACKEND = "ringtrain"


_newest: FreshStoreRendezvous | None = None  # this process's handler (one agent per `ringtrain run`)


def _create(params: RendezvousParameters) -> FreshStoreRendezvous:
    global _newest
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=-1)
    _newest = FreshStoreRendezvous(
        host, port, rank=int(params.config["rank"]), world_size=params.max_nodes,
        run_id=params.run_id, timeout=int(params.config.get("timeout", 600)),
    )
    return _newest


def workers_store(main_store: TCPStore | None, main_port: int) -> tuple[TCPStore | None, int]:
    """The store the newest attempt's workers used, and its port: the one on --master-port (``main_store``
    on node 0, None elsewhere) until a restart, then that restart's own (node 0 holds it, still open)."""
    if _newest is None or _newest.worker_port is None or _newest.worker_port == main_port:
        return main_store, main_port
    return _newest.kept_store, _newest.worker_port


def register() -> None:
    """Make ``--rdzv-backend ringtrain`` known to torchrun's agent in this process."""
    rendezvous_handler_registry.register(BACKEND, _create)  # same creator again: a no-op


class FreshStoreRendezvous(RendezvousHandler):
    """See the module docstring. One instance per ``ringtrain run`` process (agent)."""

    def __init__(self, master_addr: str, master_port: int, *, rank: int, world_size: int, run_id: str, timeout: int):
        self.master_addr, self.master_port = master_addr, master_port
        self.rank, self.world_size, self.run_id = rank, world_size, run_id
        self.timeout = timedelta(seconds=timeout)
        self._main: TCPStore | None = None  # the store on --master-port: node 0 reuses the one `ringtrain run` hosts
        self._worker_store: TCPStore | None = None  # node 0: the current restart's store, kept open while its workers run
        self.kept_store: TCPStore | None = None  # node 0, after shutdown: the last attempt's store, for the launcher
        self.worker_port: int | None = None  # the newest attempt's store port (every node)
        self._attempt = -1

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True  # workers join the store named in MASTER_ADDR/MASTER_PORT as clients

    def next_rendezvous(self) -> RendezvousInfo:
        if self._main is None:
            self._main = self._join()
        self._attempt += 1
        prefix = f"{self.run_id}/attempt-{self._attempt}"
        port = self.master_port
        if self._attempt > 0:
            key = f"{prefix}/worker_store_port"
            if self.rank == 0:
                self._worker_store = None  # the dead attempt's store goes first
                self._worker_store, port = host_store(self.master_addr, 0, self.timeout.total_seconds())
                self._main.set(key, str(port))
            else:
                port = int(self._main.get(key).decode())  # waits up to the store's timeout
        self.worker_port = port
        return RendezvousInfo(
            PrefixStore(prefix, self._main), self.rank, self.world_size,
            RendezvousStoreInfo(self.master_addr, port),
        )

    def _join(self) -> TCPStore:
        """As torchrun's static backend: node 0 serves (multi_tenant: the server that `ringtrain run`
        already listens with), the others connect; all wait until every node has, up to the timeout.

        Unlike torchrun's, nobody waits in silence: a line every few seconds says for whom
        (waiting.py), and node 0 need not block inside the store's constructor to count.
        """
        where = f"{self.master_addr}:{self.master_port}"
        timeout = self.timeout.total_seconds()
        since = time.monotonic()
        if self.rank != 0:
            reach(self.master_addr, self.master_port, since=since, timeout=timeout)
        main = TCPStore(self.master_addr, self.master_port, self.world_size, self.rank == 0, self.timeout,
                        multi_tenant=True, wait_for_workers=False)
        counter = TCPStore(self.master_addr, self.master_port, None, False, self.timeout, wait_for_workers=False)
        join_all(main, counter, f"{self.run_id}/join", self.world_size, since=since, timeout=timeout, where=where)
        return main

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0  # fixed membership: never a reason to restart

    def get_run_id(self) -> str:
        return self.run_id

    def shutdown(self) -> bool:
        # The last attempt's store stays open until this process ends: its ranks on other nodes may still
        # have to read how this node's workers died (workers_store).
        self.kept_store, self._worker_store = self._worker_store, None
        return True
