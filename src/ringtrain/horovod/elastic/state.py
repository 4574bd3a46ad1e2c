"""Elastic state objects with Horovod's API (horovod/common/elastic.py, horovod/torch/elastic/state.py).

``commit()`` remembers the current values (in memory), ``restore()`` goes back to
them, ``sync()`` makes every rank's values rank 0's. ``TorchState`` handles models
(state_dict copies, parameter broadcast), optimizers (state_dict copies, optimizer
state broadcast) and ``ElasticSampler`` s specially; other keyword values are plain
Python objects, broadcast by pickling.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod

import torch

from ..basics import rank
from ..functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .sampler import ElasticSampler


class State(ABC):
    """Base class: ``save``/``restore``/``sync``/``reset`` are up to subclasses."""

    def __init__(self, bcast_object=broadcast_object, get_rank=rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []
        self.commits = 0

    def register_reset_callbacks(self, callbacks) -> None:
        """Functions called after every reset (e.g. to rescale the learning rate to the new size)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the current state; a later failure restores to here."""
        self.save()
        self.commits += 1
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Hosts never change in a fixed host set: nothing to do."""

    @abstractmethod
    def save(self) -> None:
        """Remember the current state in memory (commit calls it)."""

    @abstractmethod
    def restore(self) -> None:
        """Go back to the last saved state (after a failure)."""

    @abstractmethod
    def sync(self) -> None:
        """Make every rank's state rank 0's."""

    def reset(self) -> None:
        """Called after re-initialisation; nothing by default."""


class ObjectState(State):
    """Keyword values become attributes, saved by value and broadcast by pickling."""

    def __init__(self, bcast_object=broadcast_object, get_rank=rank, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {attr: copy.deepcopy(getattr(self, attr)) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, copy.deepcopy(value))


class _Handler:
    def __init__(self, value):
        self.value = value
        self.save()

    def set_value(self, value) -> None:
        self.value = value
        self.save()


class _ModelHandler(_Handler):
    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))


_HANDLERS = [(torch.nn.Module, _ModelHandler), (torch.optim.Optimizer, _OptimizerHandler),
             (ElasticSampler, _SamplerHandler)]


class TorchState(ObjectState):
    """Elastic state of a PyTorch job: ``TorchState(model, optimizer, epoch=0, batch=0, ...)``."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for key, value in kwargs.items():
            handler = next((h(value) for kind, h in _HANDLERS if isinstance(value, kind)), None)
            if handler is None:
                plain[key] = value
            else:
                handlers[key] = handler
        object.__setattr__(self, "_handlers", handlers)
        for key, handler in handlers.items():
            object.__setattr__(self, key, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def __setattr__(self, name, value) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)
