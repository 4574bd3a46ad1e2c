"""Batches a script draws itself, kept across a checkpoint: ``get_batch = ring.batches(get_batch)``.

The loop people write prefetches (nanoGPT's train.py, llm.c): ``X, Y = get_batch('train')`` before the loop and
again right after each forward, so the batch of step N+1 is drawn during step N — before the safe point at the
top of step N+1 where its checkpoint is taken. A resumed run's random state (or its loader's position) is the one
*after* that draw; its own draw before the loop then gives another batch, and the resumed run is not the run it
continues (a GPT script's weights 4.0e-4 off, nothing said).

``DrawnBatches`` wraps the draw: a batch it handed out that no forward of the ring's models has used yet when the
checkpoint is taken is *held*, and rides in the checkpoint (per rank). After a resume, the first call with the same
arguments gets that batch back instead of drawing — nothing is drawn, so the random state and the loader's position
go on exactly as they did. "Used" is told by the forward, not by the batch's identity: a script may move or slice
what it drew before the forward (``x.to(device)``), and an evaluation that draws then runs the model uses its own.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ..errors import RingtrainError

_PLAIN = (str, int, float, bool, type(None))


def call_key(args: tuple, kwargs: dict) -> str:
    """Which draw a call is (``get_batch('train')`` vs ``get_batch('val')``): its plain arguments; others by type."""
    def one(value: Any) -> str:
        return repr(value) if isinstance(value, _PLAIN) else f"<{type(value).__name__}>"
    return ", ".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in sorted(kwargs.items())])


class DrawnBatches:
    """A script's batch-drawing callable, whose held batches ride in every checkpoint (see the module docstring)."""

    MAX_HELD = 16  # a prefetch holds one or two; more, with no forward between, is not a prefetch

    def __init__(self, draw: Callable[..., Any], index: int):
        if not callable(draw):
            raise RingtrainError(f"ring.batches got {type(draw).__name__}, which is not callable",
                                 "give the function that draws a batch: `get_batch = ring.batches(get_batch)`, or a "
                                 "loader's method: `next_batch = ring.batches(train_loader.next_batch)`.")
        if isinstance(draw, DrawnBatches):
            raise RingtrainError("ring.batches got a function it already wraps",
                                 "wrap the draw once: `get_batch = ring.batches(get_batch)`.")
        functools.update_wrapper(self, draw)  # type: ignore[arg-type]
        self.draw = draw
        self.index = index
        self.name = getattr(draw, "__qualname__", None) or type(draw).__name__
        self._since_forward: list[tuple[str, Any]] = []  # (call key, batch) handed out since the last forward
        self._given_back: list[tuple[str, Any]] = []  # a checkpoint's held batches, for the first calls after a resume
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = call_key(args, kwargs)
        self.calls += 1
        for i, (held_key, batch) in enumerate(self._given_back):
            if held_key == key:
                del self._given_back[i]
                self._since_forward.append((key, batch))
                return batch
        batch = self.draw(*args, **kwargs)
        self._since_forward.append((key, batch))
        del self._since_forward[:-self.MAX_HELD]
        return batch

    def forward_ran(self) -> None:
        """A model of the ring ran forward: what was drawn before it is used."""
        self._since_forward.clear()

    def held(self) -> list[tuple[str, Any]]:
        """The batches drawn and not yet used by a forward, oldest first: what a checkpoint taken now must keep."""
        return list(self._since_forward)

    def give_back(self, held: list[tuple[str, Any]]) -> None:
        """A resumed run: the checkpoint's held batches, for the first calls with their arguments."""
        self._given_back = list(held)
        self._since_forward.clear()

    @property
    def waiting(self) -> int:
        """Held batches of a checkpoint not asked for yet."""
        return len(self._given_back)

    def __repr__(self) -> str:
        return f"ring.batches({self.name})"
