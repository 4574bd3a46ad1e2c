"""The loops a ring drives: ``ring.epochs`` (epochs of ring loaders) and ``ring.steps`` (optimizer steps, for a script
that draws its own batches). Both stop at a *safe point* at the top of every iteration — where a resumed run
continues, so a due periodic save is written there and a checkpoint's random state is put back there — through
an object of the checkpoint layer (``SafePoints``: the ring's ``Resumer``), which this layer names only by what
it must do.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol

from ..errors import RingtrainError
from .held import Held


class SafePoints(Protocol):
    def safe_point(self, late: bool = False) -> None:
        """Put back a loaded checkpoint's random state; write a due periodic save."""

    def flush(self, agree: bool = True) -> None:
        """Wait for a checkpoint still being written."""

    def take_resume_epoch(self) -> int | None:
        """The epoch a loaded checkpoint continues at (once)."""

    def nothing_left(self, where: str) -> None:
        """A resumed run whose checkpoint is at the loop's end: say so (once), rather than end without a word."""


def epochs(held: Held, activity: Any, saves: SafePoints, n: int, start: int = 0) -> Iterator[int]:
    resumed = saves.take_resume_epoch()
    first = start if resumed is None else max(start, resumed)
    if resumed is not None and first >= n:
        saves.nothing_left(f"epoch {first} of ring.epochs({n})")
    try:
        for epoch in range(first, n):
            saves.safe_point()
            held.epoch = activity.epoch = epoch
            for made in held.loaders:
                made.set_epoch(epoch)
            yield epoch
            held.nonfinite.check(force=True)
        saves.safe_point()
        saves.flush()  # the last checkpoint is on disk when the epochs end
    finally:
        held.epoch = None


def steps(held: Held, saves: SafePoints, n: int) -> Iterator[int]:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise RingtrainError(f"ring.steps got n={n!r}", "give the number of optimizer steps to train (an int >= 0).")
    step = held.step
    first = True
    while True:
        saves.safe_point()
        if step.optimizer_steps >= n:
            if first:
                saves.nothing_left(f"step {step.optimizer_steps} of ring.steps({n})")
            break
        first = False
        before = (step.backwards, step.optimizer_steps, step.micro)
        yield step.optimizer_steps
        if not held.optimizers and step.optimizer_steps == before[1]:
            raise RingtrainError(
                f"ring.steps({n}) counts optimizer steps, but ring.setup was given no optimizer: ringtrain sees no "
                f"step end, so step {step.optimizer_steps} would repeat for ever",
                "give the optimizer to ring.setup and step that one: `model, optimizer = ring.setup(model, "
                "optimizer)`.")
        if (step.backwards, step.optimizer_steps, step.micro) == before:
            raise RingtrainError(
                f"an iteration of ring.steps({n}) took no step: no ring.backward and no optimizer.step() ran in it "
                f"(still at step {step.optimizer_steps})",
                "call ring.backward(loss) and optimizer.step() in every iteration of ring.steps; keep other work "
                "(evaluation, logging) in the same iteration, before or after them.")
    saves.flush()  # the last checkpoint is on disk when the steps end
