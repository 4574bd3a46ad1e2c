"""DistributedOptimizer: the user's optimizer, with gradients averaged across ranks before each step.

As in Horovod (horovod/torch/optimizer.py), the result is an instance of a class
derived from the optimizer's own class — ``isinstance(opt, torch.optim.SGD)`` still
holds, LR schedulers and ``state_dict`` work — sharing the original's param groups
and state. ``step()`` first calls ``synchronize()`` (waiting for the reductions the
gradient hooks started during backward) unless inside ``skip_synchronize()``.

``op=Adasum`` follows Horovod's delta-optimizer semantics
(``_DistributedAdasumOptimizer``): each rank applies its own optimizer step to its
local gradients, the change of every parameter (``delta = after - before``) is
combined with Adasum across ranks, and every rank sets ``parameter = before +
adasum(deltas)``. Horovod runs the local step per parameter inside the gradient
hook to overlap communication; here it runs for all parameters in ``step()`` — the
same arithmetic for per-parameter optimizers (SGD, Adam, ...), with one exchange.
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from ..errors import RingtrainError
from . import adasum, validate
from .checks import Call, Kind
from .compression import NoneCompressor
from .grad_sync import DEFAULT_FUSION_THRESHOLD, GradientSync
from .groups import ProcessSet
from .ops import ReduceOp, as_op

_CLASSES: dict = {}


class _Distributed:
    """Mixed in front of the user's optimizer class."""

    _sync: GradientSync

    def synchronize(self) -> None:
        """Finish averaging gradients now (e.g. before clipping them); then step in ``skip_synchronize()``."""
        self._sync.synchronize()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """``step()`` without synchronizing (after an explicit ``synchronize()``)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def set_backward_passes_per_step(self, passes: int) -> None:
        self._sync.set_backward_passes_per_step(passes)

    @property
    def backward_passes_per_step(self) -> int:
        return self._sync.backward_passes_per_step

    def step(self, closure=None):
        recorder = self._sync.process_set.recorder
        if recorder is not None:  # a timeline: the step (and its wait for the buckets) where no ring marks it
            with recorder.span("optimizer"):
                return self._synchronized_step(closure)
        return self._synchronized_step(closure)

    def _synchronized_step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() after optimizer.synchronize(); "
                    "gradients are synchronized twice, which slows training. Use `with optimizer.skip_synchronize():`.",
                    stacklevel=3,
                )
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._sync.pending:
            raise RingtrainError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(); gradients being reduced would be lost (a race, in Horovod's words)",
                "call zero_grad() before backward, or after step(); to accumulate, set backward_passes_per_step.",
            )
        return super().zero_grad(set_to_none)

    def load_state_dict(self, state_dict) -> None:
        self._sync.abandon()
        self._synchronized = False
        self._should_synchronize = True
        return super().load_state_dict(state_dict)


class _DistributedAdasum:
    """Delta optimizer: local step, Adasum of the parameter changes, shared result."""

    def synchronize(self) -> None:
        """Nothing to do: Adasum combines parameter changes inside ``step()`` (as in Horovod)."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise RingtrainError(
            "skip_synchronize() was used with op=Adasum",
            "Adasum combines updates inside step(); drop synchronize()/skip_synchronize() (Horovod refuses it too).",
        )
        yield  # pragma: no cover

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        start = [p.detach().clone() for p in params]
        super().step()
        with torch.no_grad():
            deltas = [p.detach() - s for p, s in zip(params, start)]
            compressed = [self._compression.compress(d) for d in deltas]
            by_kind: dict = {}
            for i, (c, _) in enumerate(compressed):
                by_kind.setdefault((c.dtype, c.device), []).append(i)
            call_problem = adasum.check_size(self._process_set)
            for (dtype, device), members in by_kind.items():
                call = Call(Kind.ADASUM, dtype, device.type, int(ReduceOp.ADASUM),
                            shape=(sum(deltas[i].numel() for i in members),),
                            agree=str([tuple(deltas[i].shape) for i in members]))
                validate.run(self._process_set, call, self._check, call_problem)
                work = [compressed[i][0].float() if compressed[i][0].element_size() < 4 else compressed[i][0]
                        for i in members]
                adasum.adasum_(work, self._process_set)
                for i, w in zip(members, work):
                    delta = self._compression.decompress(w.to(compressed[i][0].dtype), compressed[i][1])
                    params[i].copy_(start[i] + delta.to(params[i].dtype))
        return loss


def distributed_optimizer(optimizer: torch.optim.Optimizer, named_parameters=None, *, compression=NoneCompressor,
                          backward_passes_per_step: int = 1, op=ReduceOp.AVERAGE,
                          gradient_predivide_factor: float = 1.0, groups=None, process_set: ProcessSet,
                          fusion_threshold: int = DEFAULT_FUSION_THRESHOLD, check: bool = True):
    """Wrap ``optimizer`` so its gradients (or, for Adasum, its updates) are combined across ``process_set``."""
    op = as_op(op)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise RingtrainError(f"DistributedOptimizer got a {type(optimizer).__name__}",
                             "pass a torch.optim.Optimizer (e.g. torch.optim.SGD(model.parameters(), lr=0.1)).")
    if isinstance(optimizer, (_Distributed, _DistributedAdasum)):
        raise RingtrainError("DistributedOptimizer got an optimizer that is already distributed",
                             "wrap the plain optimizer once.")
    if gradient_predivide_factor != 1.0 and op != ReduceOp.AVERAGE:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    # Ranks outside the set get an optimizer with no hooks whose synchronize() does nothing, so they
    # step on their own gradients, as in Horovod (horovod/torch/optimizer.py: hooks only if included()).
    member = process_set.included()
    if member:
        process_set.require_member("DistributedOptimizer")
    names = _names(optimizer, named_parameters)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if op == ReduceOp.ADASUM and process_set.size() > 1 and member:
        wrapped = _derive(optimizer, _DistributedAdasum)
        wrapped._compression = compression
        wrapped._process_set = process_set
        wrapped._check = check
        wrapped.backward_passes_per_step = backward_passes_per_step
        wrapped._parameter_names = names
        return wrapped
    wrapped = _derive(optimizer, _Distributed)
    wrapped._parameter_names = names
    wrapped._synchronized = False
    wrapped._should_synchronize = True
    wrapped._sync = GradientSync(
        params, process_set=process_set, op=ReduceOp.AVERAGE if op == ReduceOp.ADASUM else op,
        prescale=1.0 / gradient_predivide_factor, postscale=gradient_predivide_factor,
        compression=compression, backward_passes_per_step=backward_passes_per_step,
        fusion_threshold=fusion_threshold, groups=groups, check=check,
    )
    return wrapped


def _derive(optimizer, mixin):
    base = type(optimizer)
    key = (base, mixin)
    if key not in _CLASSES:
        _CLASSES[key] = type(base.__name__, (mixin, base), {"__module__": base.__module__})
    wrapped = object.__new__(_CLASSES[key])
    wrapped.__dict__.update(optimizer.__dict__)  # the same param groups, state, defaults and hooks
    return wrapped


def local_step(optimizer, closure=None):
    """``step()`` of the optimizer's own class: no gradient averaging, no Adasum exchange."""
    if isinstance(optimizer, _Distributed):
        return super(_Distributed, optimizer).step(closure)
    if isinstance(optimizer, _DistributedAdasum):
        return super(_DistributedAdasum, optimizer).step(closure)
    return optimizer.step(closure)


def is_distributed(optimizer) -> bool:
    return isinstance(optimizer, (_Distributed, _DistributedAdasum))


def _names(optimizer, named_parameters) -> dict:
    """Horovod's checks on ``named_parameters`` (same ValueErrors), returning param -> name by id."""
    if named_parameters is None:  # Horovod's names: group index and position, unique across groups
        return {id(p): f"allreduce.noname.{i}.{j}" for i, group in enumerate(optimizer.param_groups)
                for j, p in enumerate(group["params"])}
    named = list(named_parameters)
    if any(not isinstance(item, tuple) for item in named):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually produced by "
                         "model.named_parameters().")
    seen, dups = set(), set()
    for name, _ in named:
        (dups if name in seen else seen).add(name)
    if dups:
        raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: {', '.join(sorted(dups))}")
    named_ids = {id(p) for _, p in named}
    unnamed = [id(p) for group in optimizer.param_groups for p in group["params"] if id(p) not in named_ids]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                         f"Python object ids: {', '.join(str(i) for i in unnamed)}")
    return {id(p): name for name, p in named}
