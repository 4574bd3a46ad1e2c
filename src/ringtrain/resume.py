"""Saving a run and continuing it: the part of ``Ring`` that writes and reads checkpoints.

A mixin of ``Ring`` (one idea, kept out of ring.py's way): ``save``/``load`` for
the user's objects plus what the ring itself needs to continue exactly — every
rank's RNG state, the loaders' positions, the epoch, the optimizer-step count
and the fp16 scaler — and the periodic ``checkpoint_dir`` saves that a restarted
job resumes from in ``setup``. File-level work (atomic writes, safe loading,
the manifest) is checkpoint.py's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import checkpoint
from .data import RingLoader, move_to_device
from .errors import RingtrainError


class SaveAndResume:
    """Checkpoint methods of ``Ring``; they use the ring's strategy, loaders and counters."""

    def save(self, path: str, **state: Any) -> None:
        """Write ``state`` to ``path`` from the main process, atomically; every rank returns when it is on disk.

        Modules are saved unwrapped (no ``module.`` prefix); anything with
        ``state_dict()`` is saved as its state dict; other values as they are.
        Every rank's RNG state and the loaders' positions go in too, for ``load``.
        """
        if checkpoint.META_KEY in state:
            raise RingtrainError(f"ring.save got the reserved key {checkpoint.META_KEY!r}", "rename that entry.")
        rng = self.strategy.gather_object(checkpoint.capture_rng())
        # On every rank, in the same order: a split model's parts are gathered collectively.
        payload = {name: self._state_of(v) for name, v in state.items()}
        failure: str | None = None
        if self.is_main:
            payload[checkpoint.META_KEY] = {
                "format": checkpoint.FORMAT,
                "world_size": self.world_size,
                "rng": rng,
                "loaders": [made.state() for made in self._loaders],
                "epoch": self._epoch,
                "optimizer_steps": self.accumulator.optimizer_steps,
                "scaler": self.precision.scaler.state_dict(),
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
        """Load ``path`` (on every rank) into ``targets``; return the other entries, on ``ring.device``.

        Accepts ring.save checkpoints and plain PyTorch ones, with or without
        ``module.`` prefixes; a bare state dict loads into the one module given.
        After loading a ring checkpoint, ``ring.epochs`` and the loaders continue
        where the saved run was (mid-epoch included).
        """
        ckpt = checkpoint.read(path)  # to the CPU; load_state_dict copies to the device
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
                self._move_optimizer_state(target)
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
        return {k: move_to_device(v, self.device) for k, v in ckpt.items() if k not in targets and k != checkpoint.META_KEY}

    def _restore_meta(self, meta: dict[str, Any]) -> None:
        # RNG streams are per rank: restored only when the world has the same size.
        if meta.get("world_size") == self.world_size and meta.get("rng"):
            checkpoint.restore_rng(meta["rng"][self.rank])
        self.accumulator.optimizer_steps = int(meta.get("optimizer_steps", 0))
        if meta.get("scaler") and self.precision.scaler.is_enabled():
            self.precision.scaler.load_state_dict(meta["scaler"])
        self._loader_resume = list(meta.get("loaders") or [])
        for made, saved in zip(self._loaders, self._loader_resume):
            self._resume_loader(made, saved)
        training = [s for s in self._loader_resume if not s.get("exact")]
        nexts = [s["epoch"] + 1 if s["finished"] else s["epoch"] for s in training]
        saved_epoch = meta.get("epoch")
        if nexts:
            self._resume_epoch = min(nexts)
        elif saved_epoch is not None:
            self._resume_epoch = saved_epoch + 1

    @staticmethod
    def _resume_loader(made: RingLoader, saved: dict[str, Any]) -> None:
        if saved["finished"]:
            made.resume(saved["epoch"] + 1, 0)
            return
        now = getattr(made.sampler, "num_replicas", 1)
        resharded = saved.get("replicas", now) != now
        made.resume(saved["epoch"], saved["batches"], saved.get("position") if resharded else None)

    # --- periodic checkpoints (Ring(checkpoint_dir=..., save_every=...)) -----------
    def _resume_from_checkpoint_dir(self, targets: dict[str, Any]) -> None:
        latest = self.checkpoints.latest_readable() if self.is_main else None  # type: ignore[union-attr]
        latest = self.strategy.broadcast_object(latest)
        if latest is None:
            return
        self.load(latest, **targets)
        self.print(f"ringtrain: resumed from {latest} (epoch {self._resume_epoch}, step {self.optimizer_steps})")

    def _after_step(self) -> None:
        if self.save_every and self.accumulator.optimizer_steps % self.save_every == 0:
            # Saved when the next batch is asked for: by then the user's scheduler.step()
            # and zero_grad() for this step have run too.
            self._save_due = True

    def _autosave(self) -> None:
        self._save_due = False
        self.nonfinite.check(force=True)
        step = self.accumulator.optimizer_steps
        path = self.checkpoints.path_for(step)  # type: ignore[union-attr]
        self.save(path, **self._autosave_targets)
        if self.is_main:
            self.checkpoints.commit(path, step=step, epoch=self._epoch)  # type: ignore[union-attr]
