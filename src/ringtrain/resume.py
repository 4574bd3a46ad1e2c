"""Saving a run and continuing it: ``Resumer``, which a ``Ring`` holds and delegates to.

The state machine, top to bottom:

1. ``track(targets)`` — ``ring.setup`` hands over the model/optimizer/scheduler it made; with
   a ``checkpoint_dir`` they become the periodic save's contents, and the newest complete
   checkpoint in the folder is loaded into them now (a restarted job resumes here);
2. ``add_loader(made)`` — a loader made after a load gets its saved position;
3. ``after_step()`` — the optimizer stepped: every ``save_every`` steps a save becomes due;
4. ``autosave()`` — the ring writes a due save (``save_due``) when the next batch is asked
   for (the user's scheduler.step() and zero_grad() for that step have run by then), or
   when the epochs end;
5. ``save(path, **state)`` / ``load(path, **targets)`` — the user's own checkpoints.

A ring checkpoint holds the user's objects plus what continuing exactly needs: every
rank's RNG state, the loaders' positions, the epoch, the optimizer-step count and the
fp16 scaler. File-level work (atomic writes, safe loading, the manifest) is checkpoint.py's.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from . import checkpoint
from .data import RingLoader, move_to_device
from .errors import RingtrainError
from .optim import Accumulator


class Resumer:
    """Checkpoints of one ring: what to save, when, and how to continue from one."""

    def __init__(self, strategy: Any, accumulator: Accumulator, scaler: torch.amp.GradScaler,
                 loaders: list[RingLoader], epoch: Callable[[], int | None], say: Callable[[str], None],
                 checkpoints: checkpoint.CheckpointDir | None = None, save_every: int | None = None):
        self.strategy = strategy
        self.accumulator = accumulator
        self.scaler = scaler
        self.loaders = loaders  # the ring's own list: loaders it makes later appear here too
        self.epoch = epoch
        self.say = say
        self.checkpoints = checkpoints
        self.save_every = save_every
        self.resume_epoch: int | None = None  # where ring.epochs continues after a load
        self._targets: dict[str, Any] = {}  # what the periodic save writes
        self._loader_states: list[dict[str, Any]] = []  # saved positions, by loader index
        self._save_due = False

    @staticmethod
    def checkpoint_dir(folder: str | None, save_every: int | None, keep_last: int) -> checkpoint.CheckpointDir | None:
        """``Ring(checkpoint_dir=, save_every=, keep_last=)``, checked before any process group forms."""
        if save_every is not None and (not isinstance(save_every, int) or save_every < 1 or folder is None):
            raise RingtrainError(
                f"Ring got save_every={save_every!r} with checkpoint_dir={folder!r}",
                "save_every is a positive number of optimizer steps and needs checkpoint_dir=... to save into.",
            )
        return checkpoint.CheckpointDir(folder, keep_last) if folder else None

    @property
    def is_main(self) -> bool:
        return self.strategy.rank == 0

    # --- 1, 2: what the ring set up ------------------------------------------------------
    def track(self, targets: dict[str, Any]) -> None:
        if self.checkpoints is None:
            return
        self._targets.update(targets)
        latest = self.checkpoints.latest_readable() if self.is_main else None
        latest = self.strategy.broadcast_object(latest)
        if latest is None:
            return
        self.load(latest, **targets)
        self.say(f"ringtrain: resumed from {latest} (epoch {self.resume_epoch}, step {self.accumulator.optimizer_steps})")

    def add_loader(self, made: RingLoader) -> None:
        index = self.loaders.index(made)
        if index < len(self._loader_states):
            _resume_loader(made, self._loader_states[index])

    def take_resume_epoch(self) -> int | None:
        epoch, self.resume_epoch = self.resume_epoch, None
        return epoch

    # --- 3, 4: periodic saves ----------------------------------------------------------
    def after_step(self) -> None:
        if self.save_every and self.accumulator.optimizer_steps % self.save_every == 0:
            self._save_due = True

    @property
    def save_due(self) -> bool:
        return self._save_due

    def autosave(self) -> None:
        self._save_due = False
        step = self.accumulator.optimizer_steps
        path = self.checkpoints.path_for(step)  # type: ignore[union-attr]
        self.save(path, **self._targets)
        if self.is_main:
            self.checkpoints.commit(path, step=step, epoch=self.epoch())  # type: ignore[union-attr]

    # --- 5: the user's checkpoints ------------------------------------------------------
    def save(self, path: str, **state: Any) -> None:
        """Write ``state`` to ``path`` from the main process, atomically; every rank returns when it is on disk."""
        if checkpoint.META_KEY in state:
            raise RingtrainError(f"ring.save got the reserved key {checkpoint.META_KEY!r}", "rename that entry.")
        rng = self.strategy.gather_object(checkpoint.capture_rng())
        # On every rank, in the same order: a split model's parts are gathered collectively.
        payload = {name: self._state_of(v) for name, v in state.items()}
        failure: str | None = None
        if self.is_main:
            payload[checkpoint.META_KEY] = {
                "format": checkpoint.FORMAT,
                "world_size": self.strategy.world_size,
                "rng": rng,
                "loaders": [made.state() for made in self.loaders],
                "epoch": self.epoch(),
                "optimizer_steps": self.accumulator.optimizer_steps,
                "scaler": self.scaler.state_dict(),
            }
            try:
                checkpoint.atomic_save(checkpoint.to_cpu(payload), path)
            except RingtrainError as e:
                failure = str(e)
            except Exception as e:  # disk full, permissions, unpicklable extra...
                failure = f"saving {path!r} failed: {type(e).__name__}: {e}\nHINT: check the folder's space and permissions."
        # Every rank learns the outcome, so a failed save raises everywhere instead of hanging peers.
        failure = self.strategy.broadcast_object(failure)
        if failure is not None:
            message, _, hint = failure.partition("\nHINT: ")
            raise RingtrainError(f"rank 0: {message}", hint or "see the message above.")

    def _state_of(self, value: Any) -> Any:
        if isinstance(value, nn.Module):
            return self.strategy.module_state(value)
        if isinstance(value, torch.optim.Optimizer):
            return self.strategy.optimizer_state(value)
        return checkpoint.state_of(value)

    def load(self, path: str, **targets: Any) -> dict[str, Any]:
        """Load ``path`` (on every rank) into ``targets``; return the other entries, on the ring's device."""
        ckpt = checkpoint.read(path)  # to the CPU; load_state_dict copies to the parameters' device
        modules = [name for name, t in targets.items() if isinstance(t, nn.Module)]
        if checkpoint.META_KEY not in ckpt and checkpoint.is_plain_state_dict(ckpt) and len(modules) == 1:
            ckpt = {modules[0]: ckpt}
        for name, target in targets.items():
            if name not in ckpt:
                raise RingtrainError(
                    f"the checkpoint {path!r} has no entry {name!r}; it has {sorted(k for k in ckpt if k != checkpoint.META_KEY)}",
                    "use the keyword the checkpoint was saved with, e.g. ring.load(path, model=model).",
                )
            if isinstance(target, nn.Module):
                self.strategy.load_module_state(target, ckpt[name], path)
            elif isinstance(target, torch.optim.Optimizer):
                self.strategy.load_optimizer_state(target, ckpt[name])
                move_optimizer_state(target, self.strategy.device)
            elif hasattr(target, "load_state_dict"):
                target.load_state_dict(ckpt[name])
            else:
                raise RingtrainError(
                    f"ring.load got {name}={type(target).__name__}, which has no load_state_dict",
                    "pass only objects to load into; plain values come back in the returned dict.",
                )
        meta = ckpt.get(checkpoint.META_KEY)
        if isinstance(meta, dict):
            self._restore_meta(meta)
        return {k: move_to_device(v, self.strategy.device) for k, v in ckpt.items() if k not in targets and k != checkpoint.META_KEY}

    def _restore_meta(self, meta: dict[str, Any]) -> None:
        # RNG streams are per rank: restored only when the world has the same size.
        if meta.get("world_size") == self.strategy.world_size and meta.get("rng"):
            checkpoint.restore_rng(meta["rng"][self.strategy.rank])
        self.accumulator.optimizer_steps = int(meta.get("optimizer_steps", 0))
        if meta.get("scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(meta["scaler"])
        self._loader_states = list(meta.get("loaders") or [])
        for made, saved in zip(self.loaders, self._loader_states):
            _resume_loader(made, saved)
        training = [s for s in self._loader_states if not s.get("exact")]
        nexts = [s["epoch"] + 1 if s["finished"] else s["epoch"] for s in training]
        saved_epoch = meta.get("epoch")
        if nexts:
            self.resume_epoch = min(nexts)
        elif saved_epoch is not None:
            self.resume_epoch = saved_epoch + 1


def _resume_loader(made: RingLoader, saved: dict[str, Any]) -> None:
    if saved["finished"]:
        made.resume(saved["epoch"] + 1, 0)
        return
    now = getattr(made.sampler, "num_replicas", 1)
    resharded = saved.get("replicas", now) != now
    made.resume(saved["epoch"], saved["batches"], saved.get("position") if resharded else None)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Optimizer state tensors to ``device``; the step counters stay where they are (CPU)."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device)
