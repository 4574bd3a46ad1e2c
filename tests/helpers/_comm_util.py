"""In-process stand-ins for comm/'s own tests (tests/comm): no launcher, no second process.

* ``Member(ranks, me)``: a process set as one of its members sees it (``rank()`` is ``me``), so a set of
  two can be driven from this one process;
* ``as_ranks(fn)``: each rank played by a thread, ``fn(rank)`` on each, with a hang guard; what each
  returned or raised comes back in rank order. Collectives that only exchange descriptors through a
  store (``store_check.StoreRows``: the checks, named ops, barrier, join) run like this for real;
* ``post_row``: what a peer posts in a round of ``StoreRows`` (a scripted peer, no thread needed);
* ``one_rank_group()``: a real one-rank Gloo group over a ``HashStore``, so torch.distributed calls run;
* ``EngineSpy``: what reached the engine (``dist.all_reduce`` / ``dist.broadcast``), passed on to the
  real call where there is a group.
"""

from __future__ import annotations

import contextlib
import json
import threading

import torch
import torch.distributed as dist

from ringtrain.comm import checks
from ringtrain.comm.groups import ProcessSet
from ringtrain.comm.store_check import StoreRows


class Member(ProcessSet):
    """A process set seen from its member ``me`` (a set rank), whatever this process's own rank is."""

    def __init__(self, ranks, me: int, checker=None):
        super().__init__(ranks)
        self.me = me
        self.checker = checker

    def rank(self) -> int:
        return self.me


def store_members(ranks, timeout: float = 10.0, prefix: str = "check", store=None) -> list[Member]:
    """One ``Member`` per set rank, each with its own ``StoreRows`` over one shared HashStore."""
    store = store if store is not None else dist.HashStore()
    return [Member(ranks, me, StoreRows(store, timeout, prefix)) for me in range(len(list(ranks)))]


class Raised:
    """What a rank's thread raised (``as_ranks``)."""

    def __init__(self, error: BaseException):
        self.error = error

    def __repr__(self) -> str:
        return f"Raised({self.error!r})"


def as_ranks(fn, n: int = 2, timeout: float = 20.0) -> list:
    """``fn(rank)`` in one thread per rank; each rank's return value or ``Raised(error)``, in rank order."""
    out: list = [None] * n

    def run(rank: int) -> None:
        try:
            out[rank] = fn(rank)
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out[rank] = Raised(e)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    assert not stuck, f"rank(s) {stuck} still running after {timeout} s (a hang)"
    return out


def raised(result) -> str:
    """The text of what a rank raised (fails when it returned)."""
    assert isinstance(result, Raised), f"expected an error, got {result!r}"
    return str(result.error)


def post_row(store, round_: int, rank: int, call: checks.Call, text: str | None = None, prefix: str = "check"):
    """What rank ``rank`` posts in round ``round_`` of a ``StoreRows`` exchange (a scripted peer)."""
    row = checks._encode(call)
    store.set(f"{prefix}/{round_}/{rank}", json.dumps({"row": row.wire(), "call": text or checks.describe(row)}))


@contextlib.contextmanager
def one_rank_group():
    """A real one-rank Gloo default group in this process, destroyed afterwards."""
    assert not dist.is_initialized(), "a default group is already there"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class _Done:
    """A completed engine Work (for a spy where there is no group)."""

    def wait(self):
        return True

    def is_completed(self):
        return True

    def get_future(self):
        future = torch.futures.Future()
        future.set_result(None)
        return future


class EngineSpy:
    """Records ``dist.<name>`` calls (dtype, numel, op, src, group) and passes them on when a group exists."""

    def __init__(self, monkeypatch, *names: str):
        self.calls: list[dict] = []
        for name in names:
            real = getattr(dist, name)
            monkeypatch.setattr(dist, name, self._wrap(name, real))

    def _wrap(self, name, real):
        def spy(tensor, *args, **kwargs):
            self.calls.append({"fn": name, "dtype": tensor.dtype, "numel": tensor.numel(),
                               "op": kwargs.get("op"), "src": kwargs.get("src"), "group": kwargs.get("group"),
                               "values": tensor.detach().clone()})
            if dist.is_initialized():
                return real(tensor, *args, **kwargs)
            return _Done() if kwargs.get("async_op") else None

        return spy

    def shapes(self) -> list[tuple]:
        return [(c["dtype"], c["numel"]) for c in self.calls]
