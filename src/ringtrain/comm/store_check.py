"""The debug implementation of the collective check: descriptors through the rendezvous store.

Every member writes its descriptor row (and what it is about to call, in words) under
``check/<set>/<round>/<rank>`` and waits, up to ``timeout`` seconds, for every member's.
The wait needs no collective of its own, so a rank that skipped the collective, is stuck
elsewhere or is gone is *named* on every rank instead of waited for until the engine's
timeout; and since every rank reads the same keys, every rank raises the same error.
It costs a few store round trips per collective: a debugging tool, off by default
(``Ring(debug_collectives=...)`` or ``RINGTRAIN_DEBUG_COLLECTIVES=1``).
"""

from __future__ import annotations

import contextlib
import datetime
import json
from typing import Iterator

import torch.distributed as dist

from ..errors import RingtrainError
from ..liveness.activity import waits_for_peers
from . import checks
from .groups import ProcessSet

HINT_MISSING = ("the missing rank(s) skipped this collective (a branch on the rank, an early return or break) "
                "or are stuck or dead: every rank must make the same collective calls in the same order.")
HINT_DIFFERENT = ("every rank must call the same collective with the same dtype and shape (all_gather: same "
                  "trailing dimensions) in the same order.")


class StoreRows:
    """``checks``'s checker interface, through ``store``; ``timeout`` in seconds."""

    def __init__(self, store: dist.Store, timeout: float, prefix: str = "check"):
        self.store, self.timeout, self.prefix = store, timeout, prefix
        self.round = 0
        self._text: str | None = None  # what the caller is about to run, in its own words
        self._last: tuple[int, list[str]] = (0, [])  # the latest round and what each rank called

    @contextlib.contextmanager
    def describing(self, text: str) -> Iterator[None]:
        """Name the coming collective as the caller's user knows it (``all_reduce(op=sum, float32[3])``)."""
        self._text = text
        try:
            yield
        finally:
            self._text = None

    @waits_for_peers(lambda frame: "a collective's check (the other ranks' descriptions)")
    def exchange(self, ps: ProcessSet, row: checks.Row) -> list[checks.Row]:
        self.round += 1
        n, me, size = self.round, ps.rank(), ps.size()
        keys = [f"{self.prefix}/{n}/{r}" for r in range(size)]
        text = self._text or checks.describe(row)
        self.store.set(keys[me], json.dumps({"row": row.wire(), "call": text}))
        try:
            self.store.wait(keys, datetime.timedelta(seconds=self.timeout))
        except (RuntimeError, TimeoutError) as e:  # DistStoreError is a RuntimeError
            arrived = {r: json.loads(self.store.get(k))["call"] for r, k in enumerate(keys) if self.store.check([k])}
            missing = [ps.global_rank(r) for r in range(size) if r not in arrived]
            raise RingtrainError(
                f"collective #{n}: rank(s) {missing} never arrived within {self.timeout:g}s; "
                + "; ".join(f"rank {ps.global_rank(r)} called {c}" for r, c in sorted(arrived.items())),
                HINT_MISSING,
            ) from e
        posted = [json.loads(v) for v in self.store.multi_get(keys)]
        self._last = (n, [p["call"] for p in posted])
        if n > 2:  # every member has posted round n, so all have finished reading round n-2
            with contextlib.suppress(RuntimeError):
                self.store.delete_key(f"{self.prefix}/{n - 2}/{me}")
        return [checks.Row.parse(p["row"]) for p in posted]

    def mismatch(self, ps: ProcessSet) -> RingtrainError:
        """The error for a round whose rows differ (validate.py decides that), in the callers' words."""
        n, calls = self._last
        return RingtrainError(
            f"collective #{n} differs across ranks: "
            + "; ".join(f"rank {ps.global_rank(i)} called {c}" for i, c in enumerate(calls)),
            HINT_DIFFERENT,
        )
