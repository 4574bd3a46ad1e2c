"""Handles of asynchronous collectives: ``poll()`` and ``wait()`` (Horovod's ``synchronize``).

A handle holds the engine's ``Work`` objects (``async_op=True``) and a ``finish``
step that turns the raw result into what the caller asked for (average, cast back,
trim padding, copy into an in-place target). ``finish`` runs once, on the first
``wait()``; ``poll()`` never blocks.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import RingtrainError
from ..liveness.activity import waits_for_peers


class CollectiveFailure(RingtrainError):
    """A collective failed in the engine (a peer died, a timeout passed).

    Horovod calls this ``HorovodInternalError``; ``hvd.elastic.run`` restores the
    last committed state and retries when it sees one.
    """

    def __init__(self, message: str, hint: str = "another rank probably failed first; see its error."):
        super().__init__(message, hint)


class Handle:
    """The pending result of one collective."""

    __slots__ = ("_works", "_finish", "_done", "_result", "what")

    def __init__(self, works: Sequence[Any] = (), finish: Callable[[], Any] | None = None, what: str = "collective"):
        self._works = list(works)
        self._finish = finish
        self._done = False
        self._result = None
        self.what = what

    @classmethod
    def completed(cls, result: Any, what: str = "collective") -> "Handle":
        handle = cls(what=what)
        handle._done, handle._result = True, result
        return handle

    def poll(self) -> bool:
        """True when ``wait()`` would return without blocking."""
        if self._done:
            return True
        try:
            return all(work.is_completed() for work in self._works)
        except RuntimeError as e:
            raise _failure(self.what, e) from e

    is_completed = poll  # so a handle can wait on other handles

    @waits_for_peers(lambda frame: frame.f_locals["self"].what)
    def wait(self) -> Any:
        """Block until the collective is done; return its result (the same object on every call)."""
        if not self._done:
            try:
                for work in self._works:
                    work.wait()
            except RuntimeError as e:
                self._works = []
                self._done = True
                raise _failure(self.what, e) from e
            self._works = []
            self._result = self._finish() if self._finish is not None else None
            self._finish = None
            self._done = True
        return self._result

    def __repr__(self) -> str:
        return f"<Handle {self.what} {'done' if self._done else 'pending'}>"


def _failure(what: str, error: BaseException) -> CollectiveFailure:
    from ..liveness import membership as liveness  # the board says which peer left first, when one did

    why = liveness.explain()
    if why is not None:
        # Horovod says: "Horovod has been shut down. This was caused by an exception on one of the
        # ranks or an attempt to allreduce, allgather or broadcast a tensor after one of the ranks
        # finished execution." Here the rank is named.
        return CollectiveFailure(
            f"{what} failed because {why}",
            "that rank's own error (in its output, or first in the launcher's report) is the cause; a rank "
            "that finished while others still called collectives means the ranks made different calls "
            "(a branch on the rank, a dataset that is empty on one rank).",
        )
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    return CollectiveFailure(
        f"{what} failed in the engine: {first}",
        "another rank probably exited or stopped calling collectives; its own error is the cause "
        "(with `ringtrain run` the report names the rank that failed first).",
    )
