"""The loop's whole state written to a path and read back: ``StateFiles``, what ``ring.save`` / ``ring.load`` are
and what the periodic save (resume.py's ``Resumer``, which extends it) writes through.

A ring checkpoint holds the user's objects plus what continuing exactly needs: every rank's RNG state, the
loaders' positions, the epoch, the step counters and the fp16 scaler (``_meta``). Two forms (state.py): one
``torch.save`` file gathered on rank 0 (files.py: atomic writes, safe loading), or a sharded folder every rank
writes its part of (sharded.py) — the default of strategies whose state is sharded (FSDP), asynchronous in a
``checkpoint_dir``. Either form loads into any strategy at any world size. Reading a checkpoint restores the
counters, scaler and loaders' positions at once; the RNG state waits for the loop's next safe point
(``_pending_rng``: code between ``ring.setup`` and the loop may draw random numbers).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable

import torch
from torch import nn

from ..errors import RingtrainError, on_rank, one_line
from ..loop.data import RingLoader, move_to_device
from ..loop.held import Held
from . import files, per_rank, rng, sharded, state, value_reader, values
from .model import is_plain_state_dict
from .read import read_sharded


class StateFiles:
    """Save a ring's state to a path and load it back, in either form, on every rank together."""

    def __init__(self, strategy: Any, held: Held):
        self.strategy = strategy
        self.held = held  # what the ring's loop holds (its step state, loaders, the epoch...): read, never written
        self.step = held.step
        self.scaler = held.scaler
        self.loaders = held.loaders  # the ring's own list: loaders it makes later appear here too
        self.activity = strategy.activity  # what the main thread reports: "checkpoint" while saving or loading
        self.resume_epoch: int | None = None  # where ring.epochs continues after a load
        self._targets: dict[str, Any] = {}  # what the periodic save writes (ring.extras may not shadow them)
        self._loader_states: list[dict[str, Any]] = []  # saved positions, by loader index
        self._async: sharded.AsyncSave | None = None
        self._fingerprint: dict[str, Any] = {"entries": {}}  # this run's configuration (fingerprint.py)
        self._pending_rng: dict[str, Any] | None = None  # a loaded checkpoint's random state, for the next safe point
        self._restored: per_rank.Restored | None = None  # this rank's own state from the checkpoint read (per_rank.py)
        self._captured: list[dict[str, Any]] | None = None  # every rank's own state, for the save being made
        self._encoded: set[str] = set()  # ... of which rank 0's extras, already encoded, are the entries named here

    @property
    def is_main(self) -> bool:
        return self.strategy.rank == 0

    def say(self, line: str) -> None:
        """A line for the user, from the main process."""
        if self.is_main:
            print(line, flush=True)

    def _run_fingerprint(self) -> dict[str, Any]:
        return {**self._fingerprint, "world_size": self.strategy.world_size, "global_batch": self.held.global_batch}

    @property
    def saving(self) -> bool:
        """Is an asynchronous checkpoint being written right now (on this rank)?"""
        return self._async is not None and self._async.in_flight

    def flush(self, agree: bool = True) -> None:
        """Wait for an asynchronous save still being written; a failure raises on every rank (``agree``: the
        ranks compare outcomes, a collective), or only where it happened (``ring.close``: no collective)."""
        if self._async is None:
            return
        error = self._async.wait()
        message = None if error is None else one_line(error)
        if not agree:
            if message is not None:
                raise RingtrainError(f"the asynchronous checkpoint failed: {message}",
                                     "check the checkpoint folder's space and permissions; the previous checkpoint "
                                     "is still the newest listed one.")
            return
        failures = self.strategy.gather_object(message)
        first = next(((r, m) for r, m in enumerate(failures) if m is not None), None)
        if first is not None:
            raise on_rank(RingtrainError(f"rank {first[0]}: the asynchronous checkpoint failed: {first[1]}",
                                         "check the checkpoint folder's space and permissions; the previous "
                                         "checkpoint is still the newest listed one."), first[0])

    # --- 4: the user's checkpoints ------------------------------------------------------
    def save(self, path: str, full: bool | None = None, **state_: Any) -> None:
        """Write ``state_`` to ``path``; every rank returns when it is on disk.

        ``full``: one ``torch.save`` file gathered on rank 0 (True), or a sharded folder every rank
        writes its part of (False); None: the strategy's form (sharded for FSDP, a file otherwise).
        """
        if files.META_KEY in state_:
            raise RingtrainError(f"ring.save got the reserved key {files.META_KEY!r}", "rename that entry.")
        self.activity.enter("checkpoint")
        self.flush()
        chosen = "full=True" if full else "full=False" if full is not None else None
        if full is None:
            full = not self.strategy.shards_state
        # Before any work (no gathering, nothing written or deleted): a save that changes what is at `path`
        # from a file to a folder, or back, is refused on every rank.
        default = f"{self.strategy.name}'s default form"
        self._agree(lambda: refuse_form_change(path, full, chosen or default))
        state_ = self._with_extras(state_)
        if not full:
            self._save_sharded(path, state_)
            return
        meta = self._meta()
        # On every rank, in the same order: sharded and split models are gathered collectively.
        payload = {name: self._full_state_of(v, name) for name, v in state_.items()}
        payload[files.META_KEY] = meta

        def write() -> None:
            refuse_form_change(path, True, chosen or default)  # a folder made there meanwhile
            files.atomic_save(files.to_cpu(payload), path)

        self._agree(write)

    def _sharded_parts(self, state_: dict[str, Any]) -> tuple[dict[str, torch.Tensor], Any, dict[str, str], dict]:
        """This rank's tensors, and (on every rank) the folder's skeleton — every rank's merged —, kinds and meta."""
        tree, kinds = self._local_tree(state_)
        meta = self._meta()
        tensors, skeleton = sharded.split(tree)
        return tensors, sharded.merge(self.strategy.gather_object(skeleton)), kinds, meta

    def _save_sharded(self, path: str, state_: dict[str, Any]) -> None:
        tensors, skeleton, kinds, meta = self._sharded_parts(state_)
        staging = self._agree(lambda: sharded.staging_folder(path))
        try:
            sharded.write_shards(staging, tensors)  # a failure names the rank, errno and path (dcp_failure)
        except RingtrainError:
            if self.is_main:  # what the failed save wrote (a full disk) does not stay
                with contextlib.suppress(OSError):
                    sharded.remove(staging)
            raise
        self._agree(lambda: sharded.finish(staging, path, skeleton, kinds, meta))

    def _agree(self, action: Callable[[], Any]) -> Any:
        """Run ``action`` on rank 0 and give its result to every rank; a failure raises on every rank,
        instead of leaving the others waiting."""
        result, failure = None, None
        if self.is_main:
            try:
                result = action()
            except RingtrainError as e:
                failure = str(e)
            except Exception as e:  # disk full, permissions, unpicklable extra...
                failure = f"{one_line(e)}\nHINT: check the folder's space and permissions."
        result, failure = self.strategy.broadcast_object((result, failure))
        if failure is not None:
            message, _, hint = failure.partition("\nHINT: ")
            raise on_rank(RingtrainError(f"rank 0: {message}", hint or "see the message above."), 0)
        return result

    def _with_extras(self, state_: dict[str, Any]) -> dict[str, Any]:
        """``state_`` and ``ring.extras`` (the script's own values: ``best_val_loss``, ``model_args``...); an entry
        given to ``ring.save`` wins over an extra of the same name."""
        extras = self.held.extras
        if files.META_KEY in extras:
            raise RingtrainError(f"ring.extras holds the reserved key {files.META_KEY!r}", "rename that entry.")
        taken = sorted(k for k in extras if k in self._targets)
        if taken:
            raise RingtrainError(f"ring.extras has entries named like what the ring saves: {taken}",
                                 f"rename them: {sorted(self._targets)} are the models, optimizers and schedulers.")
        # Every rank's own state (collective), encoded so the safe reader takes it back; a value that would not read
        # back is refused on every rank before anything is written. The entries at the top are rank 0's, as before
        # (torch.load(path)["best_val_loss"]); each rank resumes from its own record in the meta (per_rank.py).
        self._captured = per_rank.gather(self.strategy, self.held)
        self._encoded = set(self._captured[0]["extras"]) - set(state_)
        return {**self._captured[0]["extras"], **state_}

    def _meta(self) -> dict[str, Any]:
        """What continuing exactly needs (collective: every rank's RNG state is gathered)."""
        return {
            "extras": sorted(self._captured[0]["extras"]) if self._captured else [],
            "ranks": self._captured or [],
            "format": files.FORMAT,
            "world_size": self.strategy.world_size,
            "rng": self.strategy.gather_object(rng.capture_rng()),
            "loaders": [made.state() for made in self.loaders],
            "epoch": self.held.epoch,
            "optimizer_steps": self.step.optimizer_steps,
            "step": self.step.state_dict(),
            "scaler": self.scaler.state_dict(),
            "comm": self.strategy.comm_state(),
            "fingerprint": self._run_fingerprint(),
        }

    def _names(self, optimizer: torch.optim.Optimizer) -> tuple[dict[str, nn.Parameter], dict[int, str]]:
        module = self.held.module_of(optimizer)
        params = self.strategy.named_parameters(module) if module is not None else {}
        return params, state.parameter_names(params)

    def _full_state_of(self, value: Any, name: str = "") -> Any:
        if isinstance(value, nn.Module):
            return self.strategy.module_state(value)
        if isinstance(value, torch.optim.Optimizer):
            return self.strategy.optimizer_state(value, self.held.module_of(value))
        return self._plain(name, value)

    def _plain(self, name: str, value: Any) -> Any:
        """A value that is neither a model nor an optimizer, as the checkpoint holds it: an object's state_dict(),
        else the value encoded for the safe reader (values.py; rank 0's extras come encoded already)."""
        if hasattr(value, "state_dict") and callable(value.state_dict):
            return value.state_dict()
        return value if name in self._encoded else values.encode(value, name)

    def _local_tree(self, state_: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """What this rank holds of each entry (shards stay shards), and each entry's kind."""
        tree, kinds = {}, {}
        for name, value in state_.items():
            if isinstance(value, nn.Module):
                tree[name], kinds[name] = self.strategy.local_state(value), "module"
            elif isinstance(value, torch.optim.Optimizer):
                _, names = self._names(value)
                tree[name], kinds[name] = state.named_optimizer(value, names), "optimizer"
            else:  # rank 0's value, kept whole in ringtrain.pt (as in a full file)
                kinds[name] = "value"
                tree[name] = sharded.Whole(files.to_cpu(self._plain(name, value)))
        return tree, kinds

    def load(self, path: str, **targets: Any) -> dict[str, Any]:
        """Load ``path`` (on every rank) into ``targets``; return the other entries, on the ring's device."""
        self.activity.enter("checkpoint")
        self.flush()
        folder = sharded.is_sharded_checkpoint(path)
        if folder:
            ckpt, meta = self._read_sharded(path, targets)
        else:
            ckpt = files.read(path)  # to the CPU; load_state_dict copies to the parameters' device
            meta = ckpt.get(files.META_KEY)
            modules = [name for name, t in targets.items() if isinstance(t, nn.Module)]
            if meta is None and is_plain_state_dict(ckpt) and len(modules) == 1:
                ckpt = {modules[0]: ckpt}
        for name, target in targets.items():
            if name not in ckpt:
                raise RingtrainError(
                    f"the checkpoint {path!r} has no entry {name!r}; it has {sorted(k for k in ckpt if k != files.META_KEY)}",
                    "use the keyword the checkpoint was saved with, e.g. ring.load(path, model=model).",
                )
            if isinstance(target, nn.Module):
                if folder:  # read as this rank's layout holds it
                    self.strategy.load_local_state(target, ckpt[name])
                else:
                    self.strategy.load_module_state(target, ckpt[name], path)
            elif isinstance(target, torch.optim.Optimizer):
                if folder:
                    params, names = self._names(target)
                    state.load_named_optimizer(target, ckpt[name], names, params)
                else:
                    self.strategy.load_optimizer_state(target, ckpt[name], self.held.module_of(target))
                move_optimizer_state(target, self.strategy.device)
            elif hasattr(target, "load_state_dict"):
                target.load_state_dict(ckpt[name])
            else:
                raise RingtrainError(
                    f"ring.load got {name}={type(target).__name__}, which has no load_state_dict",
                    "pass only objects to load into; plain values come back in the returned dict.",
                )
        if isinstance(meta, dict):
            self._restore_meta(meta)
            self._restore_own(meta, ckpt, targets)
        return {k: move_to_device(value_reader.decode(v, k), self.strategy.device) for k, v in ckpt.items()
                if k not in targets and k != files.META_KEY}

    def _restore_own(self, meta: dict[str, Any], ckpt: dict[str, Any], targets: dict[str, Any]) -> None:
        """Each rank's own ``ring.extras``, ``ring.keep`` states and ``ring.batches`` back (per_rank.py); a checkpoint
        written before they were per rank gives every rank rank 0's extras, as it did."""
        records = meta.get("ranks")
        if records:
            restored = per_rank.Restored(records, self.strategy.rank, self.strategy.world_size, self.strategy.device)
            for line in restored.said:
                self.say(line)
            extras = restored.decoded_extras()
        else:
            restored = None
            extras = {k: value_reader.decode(ckpt[k], k) for k in meta.get("extras") or [] if k in ckpt and k not in targets}
        if extras or self.held.extras:  # a resumed run finds the checkpoint's values in ring.extras
            self.held.extras.clear()
            self.held.extras.update(extras)
        self._restored = restored
        if restored is None:
            return
        for name, obj in self.held.kept.items():
            restored.load_kept(name, obj)
        for drawn in self.held.batches:
            restored.give_batches(drawn)

    def keep(self, obj: Any, name: str | None) -> str:
        """``ring.keep``: held from now on; a checkpoint read already gives it its saved state now."""
        name = self.held.keep(obj, name)
        if self._restored is not None:
            self._restored.load_kept(name, obj)
        return name

    def add_batches(self, drawn: Any) -> None:
        """``ring.batches``: a checkpoint read already gives the wrapper its held batches now."""
        self.held.batches.append(drawn)
        if self._restored is not None:
            self._restored.give_batches(drawn)

    def _read_sharded(self, path: str, targets: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """A sharded folder, each rank reading the pieces its own layout holds."""
        params = {name: self._names(t)[0] for name, t in targets.items() if isinstance(t, torch.optim.Optimizer)}
        return read_sharded(self.strategy, path, targets, params)

    def _restore_meta(self, meta: dict[str, Any]) -> None:
        # RNG streams are per rank: restored only when the world has the same size, at the loop's next safe point.
        if meta.get("world_size") == self.strategy.world_size and meta.get("rng"):
            self._pending_rng = meta["rng"][self.strategy.rank]
        self.step.load_state_dict(meta.get("step") or {"optimizer_steps": meta.get("optimizer_steps", 0)})
        if meta.get("scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(meta["scaler"])
        self.strategy.load_comm_state(meta.get("comm"))
        self._loader_states = list(meta.get("loaders") or [])
        for made, saved in zip(self.loaders, self._loader_states):
            resume_loader(made, saved)
        training = [s for s in self._loader_states if not s.get("exact")]
        nexts = [s["epoch"] + 1 if s["finished"] else s["epoch"] for s in training]
        saved_epoch = meta.get("epoch")
        if nexts:
            self.resume_epoch = min(nexts)
        elif saved_epoch is not None:
            self.resume_epoch = saved_epoch + 1


def refuse_form_change(path: str, full: bool, why: str) -> None:
    """Refuse a save that would put a sharded folder where a checkpoint file is (``full`` False), or one file where a
    folder is (``full`` True): either would silently take away what a script, or a person, reads at ``path``
    (``torch.load`` of a file; a folder's shards). A link is neither: it is replaced as it always was. ``why``:
    how the form was chosen (``full=True``, or the strategy's default), for the message."""
    if os.path.islink(path) or not os.path.lexists(path):
        return
    folder = os.path.isdir(path)
    if not full and not folder:
        raise RingtrainError(
            f"ring.save({path!r}) would replace the checkpoint file there with a sharded folder ({why}); "
            "refused before anything was written: the file is unchanged",
            "save to another path (e.g. a folder name without .pt), pass full=True to write one file there as "
            "before, or remove the file first.")
    if full and folder:
        ours = sharded.problem(path) is None
        raise RingtrainError(
            f"ring.save({path!r}) would replace {'the sharded checkpoint folder' if ours else 'a folder'} there "
            f"with one checkpoint file ({why}); refused before anything was written: the folder is unchanged",
            "save to another path, pass full=False to write a sharded folder there as before, or remove the folder "
            "first." if ours else "save to another path, or move that folder away.")
    if not full and folder and os.listdir(path) and sharded.problem(path) is not None:
        raise RingtrainError(f"cannot save the sharded checkpoint to {path!r}: a folder that is not a ringtrain "
                             "checkpoint is there, and ring.save never deletes what is not its own",
                             "save to a new path, or move that folder away.")


def resume_loader(made: RingLoader, saved: dict[str, Any]) -> None:
    if saved["finished"]:
        made.resume(saved["epoch"] + 1, 0)
        return
    now = getattr(made.sampler, "num_replicas", 1)
    resharded = saved.get("replicas", now) != now
    made.resume(saved["epoch"], saved["batches"], saved.get("position") if resharded else None)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Optimizer state tensors to ``device``; the step counters stay where they are (CPU).
    Sharded state (DTensors) already sits where its parameter's shard is, and stays."""
    for param_state in optimizer.state.values():
        for key, value in param_state.items():
            if isinstance(value, torch.Tensor) and key != "step" and not state.is_sharded(value):
                param_state[key] = value.to(device)
