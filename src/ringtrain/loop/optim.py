"""Stepping only on accumulation boundaries: the optimizer, the scheduler, the no_sync window.

``Step`` (step.py) knows where in the accumulation window the loop is; ``ring.backward``
asks it how much to divide the loss by and whether this backward is the boundary (only
then does DDP synchronise). The optimizer and scheduler that ``ring.setup`` returns consult
it, so the user's loop keeps calling ``optimizer.step()`` / ``zero_grad()`` /
``scheduler.step()`` every micro-step and they act only on boundaries.
"""

from __future__ import annotations

import contextlib
import functools
import math
import types
import weakref
from typing import Any, Callable

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ..errors import RingtrainError
from ..liveness.activity import Activity
from .step import Step


class ScalerSteps:
    """One fp16 scaler shared by every optimizer of a ring: ``step`` each, then ``update`` once.

    torch's rule for several optimizers (AMP examples, "Working with multiple models,
    losses, and optimizers"): ``scaler.step(opt)`` for each optimizer, then
    ``scaler.update()`` once per iteration. ``update`` forgets what each optimizer's step
    recorded (already unscaled? inf found?) and may change the scale; run after the
    first of two optimizers, it makes the second unscale its gradients again — twice
    divided after ``ring.clip_grad_norm_`` unscaled them — or by a scale they were never
    multiplied with. So the update runs once every optimizer of the ring has stepped at
    this boundary, or, if some did not step, when the next window's first backward begins.
    """

    def __init__(self, scaler: torch.amp.GradScaler):
        self.scaler = scaler
        self._optimizers: list[int] = []  # ids of the ring's optimizers (the ring holds them)
        self._stepped: set[int] = set()

    def add(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizers.append(id(optimizer))

    def step(self, optimizer: torch.optim.Optimizer, step: Callable[[], Any]) -> Any:
        """Run ``step`` (which calls ``scaler.step(optimizer)``) and update when every optimizer has stepped."""
        if id(optimizer) in self._stepped:
            self.update()  # stepped again with no backward between: the earlier boundary is over
        result = step()
        self._stepped.add(id(optimizer))
        if self._stepped.issuperset(self._optimizers):
            self.update()
        return result

    def update(self) -> None:
        """``scaler.update()`` if any optimizer stepped since the last one (it needs their inf checks)."""
        if self._stepped:
            self._stepped.clear()
            self.scaler.update()


def wrap_optimizer(
    optimizer: torch.optim.Optimizer,
    step_state: Step,
    scaler_steps: ScalerSteps,
    step_context: Callable[[torch.optim.Optimizer], Any] = lambda optimizer: contextlib.nullcontext(),
    activity: Activity | None = None,
) -> torch.optim.Optimizer:
    """Gate ``optimizer.step`` / ``zero_grad`` on ``step_state``'s boundaries, in place; return it.

    The gate is an instance attribute wrapping whatever ``step`` the optimizer has
    now — which is how torch's LR schedulers track steps too — so the layers
    compose in either order: a scheduler made earlier sees only real steps, one
    made later wraps the gate. It stays the same object and the same class (an
    ``SGD`` is still an ``SGD``), and the variable the user already holds is gated.
    """
    if getattr(optimizer.step, "_ringtrain_gate", False):
        raise RingtrainError("ring.setup got an optimizer that a ring already set up", "pass each optimizer once.")
    activity = Activity() if activity is None else activity  # the ring's: the watchdog reads it
    previous_step = optimizer.step
    previous_zero_grad = optimizer.zero_grad
    inside = [False]
    seen = [0]  # step_state.backward_calls at this optimizer's last step
    scaler = scaler_steps.scaler
    scaler_steps.add(optimizer)

    # functools.wraps carries the wrapped step's attributes (a scheduler's marker among
    # them); MethodType keeps it a bound method, which schedulers made later expect.
    @functools.wraps(previous_step)
    def step(self: torch.optim.Optimizer, closure: Callable[[], Any] | None = None) -> Any:
        if inside[0]:
            # GradScaler.step calls optimizer.step(): this is that inner call.
            return previous_step(closure) if closure is not None else previous_step()
        if step_state.backward_calls == seen[0] and (step_state.k > 1 or scaler.is_enabled()):
            raise_backward_not_ring(step_state.k, scaler.is_enabled())
        seen[0] = step_state.backward_calls
        step_state.step_called()  # a step the window does not end raises here, in a loop that accumulates itself
        if not step_state.sync_now:
            return None
        if step_state.take_drop():
            return None  # ring.backward saw a non-finite loss in this window (nonfinite="skip")
        with step_context(optimizer), activity.timed("optimizer", "sync"):
            if scaler.is_enabled():
                # The scaler unscales (unless clipping already did) and skips the step if any
                # gradient is inf/NaN; ScalerSteps updates the scale once all optimizers stepped.
                def scaled_step() -> Any:
                    inside[0] = True
                    try:
                        return scaler.step(optimizer, closure) if closure is not None else scaler.step(optimizer)
                    finally:
                        inside[0] = False

                result = scaler_steps.step(optimizer, scaled_step)
            else:
                result = previous_step(closure) if closure is not None else previous_step()
        step_state.stepped()
        activity.step_ends(step_state.optimizer_steps)  # the step's times end with the step (StepTimes)
        return result

    @functools.wraps(previous_zero_grad)
    def zero_grad(self: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        if step_state.sync_now:
            previous_zero_grad(set_to_none=set_to_none)

    step._ringtrain_gate = True  # type: ignore[attr-defined]
    optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]
    optimizer.zero_grad = types.MethodType(zero_grad, optimizer)  # type: ignore[method-assign]
    return optimizer


def raise_backward_not_ring(k: int, fp16: bool) -> None:
    """``optimizer.step()`` with no ``ring.backward`` since its last step, where that matters (
    ``loss.backward()`` under ``Ring(accumulate=4)`` stepped on every batch, and the global batch printed was false)."""
    why = []
    if k > 1:
        why.append(f"Ring(accumulate={k}) counts micro-batches by ring.backward, so every optimizer.step() after a "
                   f"plain loss.backward() would be a real step: the optimizer would step on every batch, not every {k}, "
                   "and the global batch the ring printed would be false")
    if fp16:
        why.append("fp16 training scales the loss in ring.backward; after a plain loss.backward() the scaler would "
                   "unscale gradients that were never scaled")
    raise RingtrainError(
        "optimizer.step() was called with no ring.backward(loss) since this optimizer's last step: " + "; and ".join(why),
        "replace loss.backward() with ring.backward(loss) (it divides the loss by the window, scales it for fp16 and "
        "skips the gradient all-reduce inside the window).")


class ReplacedParameters:
    """The parameters a strategy put something else in place of (FSDP's shards, a meta-device model made real), for
    an optimizer ``ring.setup`` was not given: built on the model before the setup, it holds tensors nobody uses, and
    training silently stays where it began (FSDP at chance level, said only at ``ring.save``).
    torch's global step pre-hook names it at its first step."""

    def __init__(self) -> None:
        self._refs: dict[int, Any] = {}  # id -> weakref of a replaced parameter (ids alone could be reused)
        self._given: list[Any] = []  # weakrefs of the optimizers ring.setup got (pointed at the new parameters)
        self._checked: set[int] = set()
        self._handle: Any = None

    def swap(self, originals: dict[str, torch.Tensor], now: dict[str, torch.Tensor],
             given: torch.optim.Optimizer | None) -> dict[int, torch.Tensor]:
        """The parameters the strategy replaced, id(old) -> new (for ``replace_parameters``); the old ones are
        watched for an optimizer ``ring.setup`` was not given (``given``: the one it was)."""
        replaced = {name: p for name, p in now.items() if name in originals and originals[name] is not p}
        self.add([originals[name] for name in replaced], given)
        return {id(originals[name]): p for name, p in replaced.items()}

    def add(self, params: list[torch.Tensor], given: torch.optim.Optimizer | None) -> None:
        self._refs.update({id(p): weakref.ref(p) for p in params})
        if given is not None:
            self._given.append(weakref.ref(given))
        if params and self._handle is None:
            self._handle = register_optimizer_step_pre_hook(self._check)

    def _check(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if id(optimizer) in self._checked:
            return
        self._checked.add(id(optimizer))
        if any(ref() is optimizer for ref in self._given):
            return
        stale = sum(1 for group in optimizer.param_groups for p in group["params"]
                    if (ref := self._refs.get(id(p))) is not None and ref() is p)
        if stale:
            raise RingtrainError(
                f"this {type(optimizer).__name__} steps {stale} parameter(s) that ring.setup replaced (the strategy "
                "put shards or real tensors in their place): it was built on the model before ring.setup and not "
                "given to it, so its steps change nothing the model uses, and training would stay where it began",
                "give the optimizer to ring.setup — `model, optimizer = ring.setup(model, optimizer)` — or build it "
                "after ring.setup from the model ring.setup returned.")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def replace_parameters(optimizer: torch.optim.Optimizer, replaced: dict[int, torch.nn.Parameter]) -> None:
    """Point ``optimizer`` at the parameters a strategy put in place of the user's, in place.

    FSDP swaps every parameter for its shard (a DTensor), a model built on the meta device gets
    real tensors: an optimizer built on the old ones would step tensors nobody uses. The same
    object keeps its class, parameter groups (order included) and hyperparameters, so the
    variable the user holds and a scheduler built on it follow. ``replaced``: id(old) -> new.
    """
    if not any(id(p) in replaced for group in optimizer.param_groups for p in group["params"]):
        return
    if optimizer.state:
        raise RingtrainError(
            f"ring.setup got a {type(optimizer).__name__} that already holds state (it has stepped, or a state was "
            "loaded into it), but the strategy replaces the model's parameters, so that state would be lost",
            "build the optimizer fresh, pass it to ring.setup, and load its state afterwards with ring.load(path, "
            "optimizer=optimizer).",
        )
    for group in optimizer.param_groups:
        group["params"] = [replaced.get(id(p), p) for p in group["params"]]


class NonFiniteGuard:
    """What a NaN/inf loss does: ``"raise"`` (naming the step), ``"skip"`` (drop the window), ``"ignore"``."""

    def __init__(self, mode: str, strategy: Any):
        if mode not in ("raise", "skip", "ignore"):
            raise RingtrainError(f"Ring got nonfinite={mode!r}", "use 'raise', 'skip' or 'ignore'.")
        self.mode = mode
        self.strategy = strategy
        self._flags: list[tuple[torch.Tensor, int, int | None]] = []

    def skip(self, loss: torch.Tensor, step: int, epoch: int | None) -> bool:
        """True when this micro-batch's window must be dropped (mode "skip", agreed by every rank)."""
        if self.mode == "ignore":
            return False
        if self.mode == "raise" and loss.device.type == "cpu" and loss.numel() == 1:
            # The common case, at the cost of one .item() (a full isfinite/all/item costs ~20 us).
            value = loss.item()
            if not math.isfinite(value):
                self._flags.append((torch.tensor(False), step, epoch))
                self.check(force=True)
            return False
        finite = torch.isfinite(loss.detach()).all()
        if self.mode == "skip":
            # Every rank must agree, or one would step while another skips.
            return bool(self.strategy.all_reduce(finite.to(torch.int32), op="min").item() == 0)
        # "raise": on the CPU a check costs nothing; on a GPU reading it would stall the
        # queue every step, so flags are kept on the device and read every 32 steps.
        self._flags.append((finite, step, epoch))
        self.check(force=finite.device.type == "cpu" or len(self._flags) >= 32)
        return False

    def check(self, force: bool) -> None:
        """Raise for the first non-finite loss recorded so far (read now if ``force``)."""
        if not force or not self._flags:
            return
        flags, self._flags = self._flags, []
        ok = torch.stack([f for f, _, _ in flags]).tolist()
        if all(ok):
            return
        _, step, epoch = flags[ok.index(False)]
        raise RingtrainError(
            f"the loss was NaN or infinite at optimizer step {step}"
            + (f" (epoch {epoch})" if epoch is not None else "")
            + f" on rank {self.strategy.rank}",
            "lower the learning rate, clip gradients (ring.clip_grad_norm_), check the data for NaNs, or use "
            "Ring(nonfinite='skip') to drop such steps on every rank.",
        )


class RingScheduler:
    """An LR scheduler whose ``step()`` acts only right after a real optimizer step."""

    def __init__(self, scheduler: Any, step_state: Step):
        self._scheduler = scheduler
        self._step = step_state

    def step(self, *args: Any, **kwargs: Any) -> None:
        if self._step.just_stepped or self._step.k == 1:
            self._scheduler.step(*args, **kwargs)

    @property
    def inner(self) -> Any:
        return self._scheduler

    def __getattr__(self, name: str) -> Any:
        return getattr(self._scheduler, name)


def scale_lr(base_lr: float, base_batch: int, global_batch: int, rule: str = "linear") -> float:
    """Learning rate for ``global_batch`` given one tuned at ``base_batch``.

    ``"linear"``: lr x (global/base) (Goyal et al. 2017, "Accurate, Large Minibatch
    SGD"); ``"sqrt"``: lr x sqrt(global/base) (Krizhevsky 2014; common for Adam).
    """
    if base_batch <= 0 or global_batch <= 0:
        raise RingtrainError(
            f"scale_lr got base_batch={base_batch}, global_batch={global_batch}", "batch sizes must be positive."
        )
    ratio = global_batch / base_batch
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * ratio**0.5
    raise RingtrainError(f"scale_lr got rule={rule!r}", "use rule='linear' or rule='sqrt'.")


class NoSyncWindow:
    """Inside an accumulation window, run forward and backward under the strategy's ``no_sync``.

    Decided before the forward, because DDP reads its ``no_sync`` flag in forward
    (DistributedDataParallel.forward -> reducer.prepare_for_backward), not in backward; the
    region is closed after the backward (``close``). One all-reduce per optimizer step.
    """

    def __init__(self, step_state: Step, no_sync: Callable[[Any], Any], remaining: Callable[[], int | None]):
        self.step = step_state
        self.no_sync = no_sync
        self.remaining = remaining
        self._open: dict[int, Any] = {}  # open no_sync regions, by id of the wrapped model

    def attach(self, module: torch.nn.Module) -> None:
        module.register_forward_pre_hook(self._before_forward)

    def _before_forward(self, module: torch.nn.Module, args: Any) -> None:
        if not torch.is_grad_enabled():
            return
        stale = self._open.pop(id(module), None)
        if stale is not None:  # a forward whose backward never came (e.g. a skipped batch)
            stale.__exit__(None, None, None)
        if not self.step.boundary_ahead(self.remaining()):
            region = self.no_sync(module)
            region.__enter__()
            self._open[id(module)] = region

    def close(self) -> None:
        for region in self._open.values():
            region.__exit__(None, None, None)
        self._open.clear()
