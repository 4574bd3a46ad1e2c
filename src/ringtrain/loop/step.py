"""Where the training loop is: the accumulation window, the optimizer steps taken, what is due.

``Step`` is the one object that holds the loop's counters, and its methods are the only
writers: the Ring advances the window (``next_backward``), the gated optimizer reports a
real step (``stepped``) or asks whether the window was dropped (``take_drop``), a
checkpoint reads and restores it (``state_dict`` / ``load_state_dict``). The Ring asks it
whether a periodic save is due and decides when to write it (between two batches, where
everything of the last step — scheduler and zero_grad included — is done).

With ``Ring(accumulate=k)`` a *window* is k micro-batches whose gradients add up before one
optimizer step. Epoch ends are *flushed*: when a ring loader is on its last batches, the
window shrinks to what is left (and the loss is divided by that smaller count), so an epoch
of n micro-batches always ends with a step, no gradient leaks into the next epoch, and a
short window equals one batch of its samples. Loaders not made by the ring carry the window
over instead (the ring cannot see their end).

Two loops are both right, and ``Step`` tells them apart at the first ``optimizer.step()``:

* *the ring accumulates* (``mode == "gated"``): ``optimizer.step()`` after every ``ring.backward``;
  the calls between boundaries do nothing, and windows shrink at a ring loader's epoch end;
* *the script accumulates* (``mode == "own"``): k ``ring.backward`` calls, then one
  ``optimizer.step()`` — a window is then always k calls, whatever the epochs do, so the
  script's steps and the ring's boundaries stay together.

When they part — a step with no boundary since the last one, in a loop that accumulates itself,
or a backward that starts a window after a boundary no step followed — the first such call raises
a ``RingtrainError`` naming both counts: never a silent no-op step.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import RingtrainError


class Step:
    """The loop's position: inside the accumulation window, and in optimizer steps."""

    def __init__(self, k: int, save_every: int | None = None):
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise RingtrainError(f"Ring got accumulate={k!r}", "accumulate is a number of micro-batches: 1 or more.")
        self.k = k
        self.save_every = save_every
        self.micro = 0  # micro-batches already in the current window
        self.window = k
        self.sync_now = True  # did the last backward end a window?
        self.just_stepped = False  # was the optimizer stepped since the last backward?
        self.optimizer_steps = 0
        self.skipped_steps = 0  # windows dropped for a non-finite loss (nonfinite="skip")
        self.save_due = False
        self.mode: str | None = None  # "gated" or "own" (see the module docstring), once the first step shows it
        self.backwards = 0  # ring.backward calls since the last optimizer.step() of any optimizer
        self.backward_calls = 0  # ring.backward calls in this process, ever (an optimizer's step asks: any since mine?)
        self.trained = False  # has this process trained (a backward, a step)? A resumed run has not, yet
        self.stepped_since_boundary = True
        self._drop_window = False
        self._lrs: list[float] | None = None
        self._new_window_hooks: list[Any] = []
        self.stepped_hooks: list[Any] = []  # called after each real optimizer step (the plan's check of step 1)

    def set_k(self, k: int, what: str = "accumulate") -> None:
        """A new window size, before this process's first backward (a script derives it from the world size). A
        resumed run sets it again after ``ring.setup`` restored its steps: checkpoints are taken between windows,
        and a new world size may need another window for the same global batch (``Ring(global_batch=...)``)."""
        Step(k)  # the same checks as Ring(accumulate=k)
        if self.trained or self.backwards or self.micro or self.mode is not None:
            raise RingtrainError(
                f"{what} was changed to {k} after training began (window of {self.k}, "
                f"{self.optimizer_steps} optimizer step(s) taken)",
                "set ring.accumulate (or Ring(global_batch=...)) before the first ring.backward.")
        self.k = self.window = k

    # --- the window -------------------------------------------------------------------------
    def boundary_ahead(self, remaining: int | None) -> bool:
        """Will the coming backward end the window? Decided before the forward, because
        DDP reads its ``no_sync`` flag in forward (DistributedDataParallel.forward →
        reducer.prepare_for_backward), not in backward. A loop that accumulates itself keeps
        its windows whole at epoch ends (its step comes after k backward calls, not sooner)."""
        if self.micro == 0:
            shrink = remaining is not None and self.mode != "own"
            self.window = max(1, min(self.k, remaining)) if shrink else self.k
        return self.micro + 1 >= self.window

    def on_new_window(self, hook: Any) -> None:
        """Call ``hook()`` when a window's first backward begins (the fp16 scaler's deferred update)."""
        self._new_window_hooks.append(hook)

    def on_stepped(self, hook: Any) -> None:
        """Call ``hook()`` after each real optimizer step, until it is taken out of ``stepped_hooks``."""
        self.stepped_hooks.append(hook)

    def next_backward(self, remaining: int | None) -> tuple[int, bool]:
        """Advance one micro-step; return (loss divisor, is this the boundary)."""
        if self.micro == 0:
            if self.k > 1 and not self.stepped_since_boundary and self.optimizer_steps + self.backwards:
                raise RingtrainError(
                    f"ring.backward was called after an accumulation boundary that no optimizer.step() followed: "
                    f"Ring(accumulate={self.k}) ended a window of {self.window} micro-batch(es) at the last "
                    "ring.backward, and its gradients would be added to the next window's",
                    "call optimizer.step() (and optimizer.zero_grad()) once the window's ring.backward calls are "
                    f"done: after every ring.backward (the ring steps every {self.k}), or after exactly {self.k}.")
            for hook in self._new_window_hooks:
                hook()
        boundary = self.boundary_ahead(remaining)
        divisor = self.window
        self.micro = 0 if boundary else self.micro + 1
        self.sync_now = boundary
        self.just_stepped = False
        self.backwards += 1
        self.backward_calls += 1
        self.trained = True
        if boundary:
            self.stepped_since_boundary = False
        return divisor, boundary

    def step_called(self) -> None:
        """``optimizer.step()`` was called (any optimizer, before the gate decides): learn which loop this is,
        and refuse a step that the ring's window does not end (see the module docstring)."""
        if self.k == 1:
            self.backwards = 0
            self.stepped_since_boundary = True
            return
        if self.backwards == 0:
            return  # another optimizer's step in the same window, or a step before any backward
        if self.mode is None:
            self.mode = "gated" if self.backwards == 1 else "own"
        if self.sync_now:
            self.backwards = 0
            self.stepped_since_boundary = True
            return
        if self.mode == "own":
            raise RingtrainError(
                f"optimizer.step() came after {self.backwards} ring.backward call(s), but Ring(accumulate={self.k}) "
                f"ends a window every {self.k}: this step would do nothing, and the gradients would pile up",
                f"call ring.backward exactly {self.k} times per optimizer.step() (or set ring.accumulate to the "
                "number of micro-batches your loop takes per step), or call optimizer.step() after every "
                "ring.backward and let the ring step every k.")

    def check_lr(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """A scheduler stepped inside a window would run k times too fast: make that loud."""
        if self.k == 1:
            return
        lrs = [float(g["lr"]) for opt in optimizers for g in opt.param_groups if "lr" in g]
        if self.micro == 0 or self._lrs is None:
            self._lrs = lrs
        elif lrs != self._lrs:
            raise RingtrainError(
                f"the learning rate changed in the middle of an accumulation window (accumulate={self.k}): "
                "an LR scheduler is stepping every micro-batch, so its schedule would run "
                f"{self.k}x too fast",
                "pass the scheduler through ring.setup(model, optimizer, scheduler) — it then steps only on "
                "accumulation boundaries — or step it once per epoch.",
            )

    # --- what the optimizer did -----------------------------------------------------------------
    def drop(self) -> None:
        """This window saw a non-finite loss (``nonfinite="skip"``): its optimizer step is dropped."""
        self._drop_window = True

    def take_drop(self) -> bool:
        """The gated optimizer asks before stepping: True (and counted) when the window was dropped."""
        if not self._drop_window:
            return False
        self._drop_window = False
        self.skipped_steps += 1
        return True

    def stepped(self) -> None:
        """The optimizer took a real step; a periodic save becomes due every ``save_every`` steps."""
        self.optimizer_steps += 1
        self.just_stepped = True
        self.trained = True
        if self.save_every and self.optimizer_steps % self.save_every == 0:
            self.save_due = True
        for hook in tuple(self.stepped_hooks):  # a hook may take itself out
            hook()

    def saved(self) -> None:
        self.save_due = False

    # --- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        return {"optimizer_steps": self.optimizer_steps, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint (taken between windows: the window starts afresh)."""
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.micro, self.sync_now, self.just_stepped, self.save_due = 0, True, False, False
        self.backwards, self.stepped_since_boundary = 0, True
        self._drop_window = False
