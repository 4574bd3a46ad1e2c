"""An evaluation on some ranks alone, where the model's forward exchanges data with the other ranks (FSDP's
gathers of each unit's shards, tensor parallelism's activations inside each TP group): it would pair its
collectives with another rank's training and hang or mix the two. Before each forward under ``torch.no_grad``
the ranks meet in the job's store (a key each, no collective); a rank the others do not join within the stall
warning is named, with the fix."""

from __future__ import annotations

import datetime
from typing import Any

import torch
from torch import nn

from ..errors import RingtrainError
from ..liveness.activity import user_site


class EvaluationTogether:
    """A forward pre-hook: ``model`` and ``because`` say what the message names (FSDP's by default)."""

    def __init__(self, strategy: Any, model: str = "the FSDP-sharded model",
                 because: str = "FSDP's forward gathers every unit's shards from every rank", prefix: str = "fsdp-eval"):
        self.strategy, self.model, self.because, self.prefix = strategy, model, because, prefix
        self.count = 0

    def __call__(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled():
            return
        self.count += 1
        group, rank, world = self.strategy.group, self.strategy.rank, self.strategy.world_size
        store, wait = group.store, group.options.stall_warning or 60.0
        keys = [f"{self.prefix}/{self.count}/{r}" for r in range(world)]
        store.set(keys[rank], "1")
        try:
            store.wait(keys, datetime.timedelta(seconds=wait))
        except (RuntimeError, OSError) as e:
            missing = [r for r, key in enumerate(keys) if not store.check([key])]
            raise RingtrainError(
                f"rank {rank} ran a forward of {self.model} under torch.no_grad (evaluation #{self.count}) "
                f"at {user_site() or 'an unknown line'}, and rank(s) {missing} did not run one within {wait:g} s: "
                f"{self.because}, so an evaluation on some ranks alone waits for ranks that are elsewhere",
                "evaluate on every rank (a ring.loader with exact=True, then ring.all_reduce the metric), or "
                "ring.save the model and evaluate the checkpoint in a process of its own.") from e
