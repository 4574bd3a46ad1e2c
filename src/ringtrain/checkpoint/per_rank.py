"""What each rank holds of its own, in every checkpoint: its ``ring.extras``, the objects it handed to ``ring.keep``
(a script's own loader with its position, a sampler, an EMA), and the batches ``ring.batches`` holds across the
checkpoint (a prefetch).

Once ``ring.extras`` were rank 0's, and every rank got rank 0's values back: a loader position kept there
resumed rank 1 at rank 0's place (4.6e-4 off, nothing said). Now every rank's own state is gathered into the
checkpoint's meta (``ranks``: one record per rank, encoded by values.py so the safe reader takes it back), and each
rank gets its own back. At another world size a value follows only where that is unambiguous — the same on every
rank, or rank 0's only — and a per-rank state that cannot follow is refused naming it, with the fix.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import RingtrainError, on_rank
from ..loop.data import move_to_device
from ..loop.held import Held
from . import files, value_reader, values


def capture(held: Held) -> dict[str, Any]:
    """This rank's own state, encoded for the safe reader; a value that could not be read back raises here, naming it."""
    kept = {}
    for name, obj in held.kept.items():
        kept[name] = values.encode(files.to_cpu(obj.state_dict()), f"ring.keep({name})")
    batches = []
    for drawn in held.batches:
        entries = []
        for key, batch in drawn.held():
            on_device = any(t.device.type != "cpu" for t in _tensors(batch))
            entries.append([key, values.encode(files.to_cpu(batch), f"{drawn!r}"), on_device])
        batches.append(entries)
    return {"extras": held.extras.encoded(), "kept": kept, "batches": batches}


def gather(strategy: Any, held: Held) -> list[dict[str, Any]]:
    """Every rank's ``capture`` (collective); a rank whose state cannot be saved makes every rank raise its error,
    before anything is written."""
    try:
        mine: Any = capture(held)
    except RingtrainError as e:
        mine = {"refused": [e.message, e.hint]}
    everyone = strategy.gather_object(mine)
    for rank, record in enumerate(everyone):
        if "refused" in record:
            message, hint = record["refused"]
            raise on_rank(RingtrainError(f"rank {rank}: {message}; nothing was saved (the previous checkpoints are "
                                         "unchanged)", hint), rank)
    return everyone


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in _tensors(v)]
    return []


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and bool(torch.equal(a, b)))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


class Restored:
    """This rank's part of a checkpoint's per-rank records: what ``ring.extras``, ``ring.keep`` and ``ring.batches``
    get back (``extras``, ``kept``, ``batches``), and what to say about it (``said``)."""

    def __init__(self, records: list[dict[str, Any]], rank: int, world_size: int, device: torch.device):
        self.said: list[str] = []
        self.device = device
        if len(records) == world_size:
            mine = records[rank]
            self.extras = dict(mine.get("extras") or {})
            self.kept = dict(mine.get("kept") or {})
            self.batches = [list(b) for b in mine.get("batches") or []]
            return
        self.extras = self._extras_across(records, rank, world_size)
        self.kept = self._kept_across(records, world_size)
        self.batches = []
        if any(entries for record in records for entries in record.get("batches") or []):
            self.said.append(f"ringtrain: the checkpoint holds batches drawn before it (ring.batches) by its "
                             f"{len(records)} ranks; this run has {world_size}, so they are drawn anew")

    def _extras_across(self, records: list[dict[str, Any]], rank: int, world_size: int) -> dict[str, Any]:
        """``ring.extras`` at another world size: a value the same on every rank goes to every rank, rank 0's only
        goes to rank 0; one that differs between ranks cannot be given to anyone."""
        out: dict[str, Any] = {}
        keys = sorted({k for record in records for k in record.get("extras") or {}})
        for key in keys:
            holders = [r for r, record in enumerate(records) if key in (record.get("extras") or {})]
            first = records[holders[0]]["extras"][key]
            if len(holders) == len(records) and all(_same(first, records[r]["extras"][key]) for r in holders):
                out[key] = first
            elif holders == [0]:
                if rank == 0:
                    out[key] = first
                self.said.append(f"ringtrain: ring.extras[{key!r}] was rank 0's only: rank 0 has it back")
            else:
                raise RingtrainError(
                    f"ring.extras[{key!r}] differs between the {len(records)} ranks that saved it, and this run has "
                    f"{world_size} ranks: which rank's value each new rank should get is not known",
                    f"resume with {len(records)} ranks; or keep such a value the same on every rank (e.g. reduce it "
                    "first with ring.all_reduce), or set it on rank 0 only, so that it can follow a new world size.")
        return out

    def _kept_across(self, records: list[dict[str, Any]], world_size: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        names = sorted({k for record in records for k in record.get("kept") or {}})
        for name in names:
            states = [(record.get("kept") or {}).get(name) for record in records]
            if any(s is None for s in states) or not all(_same(states[0], s) for s in states[1:]):
                raise RingtrainError(
                    f"ring.keep({name}) holds a state of each rank's own (e.g. a loader's position in its shard of "
                    f"the data), saved by {len(records)} ranks; this run has {world_size} ranks, and a per-rank "
                    "state cannot be split or merged by ringtrain",
                    f"resume with {len(records)} ranks (--nproc-per-node / --nnodes as before); or make the object's "
                    "state_dict() hold what all ranks share (a global position) and derive each rank's own from it "
                    "in load_state_dict, so it can follow a new world size.")
            out[name] = states[0]
        return out

    def decoded_extras(self) -> dict[str, Any]:
        return {k: move_to_device(value_reader.decode(v, f"ring.extras[{k!r}]"), "cpu") for k, v in self.extras.items()}

    def load_kept(self, name: str, obj: Any) -> bool:
        """Load the saved state of ``ring.keep(obj)`` into it; False when the checkpoint has none under ``name``."""
        if name not in self.kept:
            return False
        state = value_reader.decode(self.kept.pop(name), f"ring.keep({name})")
        try:
            obj.load_state_dict(state)
        except Exception as e:
            raise RingtrainError(
                f"ring.keep({name}): its load_state_dict raised {type(e).__name__}: {e}",
                "make load_state_dict accept what its state_dict() returns (the checkpoint holds that).") from e
        return True

    def give_batches(self, drawn: Any) -> None:
        """The held batches of ``ring.batches`` wrapper number ``drawn.index`` back to it (on the ring's device where
        they were on a device)."""
        if drawn.index >= len(self.batches) or not self.batches[drawn.index]:
            return
        entries, self.batches[drawn.index] = self.batches[drawn.index], []
        back = []
        for key, encoded, on_device in entries:
            batch = value_reader.decode(encoded, f"{drawn!r}")
            back.append((key, move_to_device(batch, self.device) if on_device else batch))
        drawn.give_back(back)
