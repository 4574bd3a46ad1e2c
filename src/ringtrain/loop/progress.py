"""A progress bar on the main process only, showing samples per second, the loss and the values ``ring.log`` logged."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Iterator

import torch
from tqdm.auto import tqdm


def batch_samples(batch: Any) -> int:
    """Number of samples in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = batch_samples(item)
            if n:
                return n
    return 0


class Progress:
    """Wraps an iterable; on non-main ranks it only passes items through.

    The values shown are the latest ``ring.log`` wrote (means over the ranks); the loss, when none
    named ``loss`` was logged, is this rank's last one given to ``ring.backward``. Reading it forces a
    device sync, so it is read only when the bar redraws (``refresh`` seconds), never per step.
    Samples/s counts all ranks (this rank's samples x world size).
    """

    def __init__(
        self,
        iterable: Iterable[Any],
        *,
        enabled: bool,
        world_size: int,
        last_loss: Callable[[], torch.Tensor | None],
        desc: str | None = None,
        total: int | None = None,
        refresh: float = 0.5,
        logged: Callable[[], dict[str, float]] = dict,
    ):
        self.logged = logged
        self.iterable = iterable
        self.enabled = enabled
        self.world_size = world_size
        self.last_loss = last_loss
        self.desc = desc
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.refresh = refresh

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if not self.enabled:
            yield from self.iterable
            return
        bar = tqdm(total=self.total, desc=self.desc, dynamic_ncols=True, leave=True)
        start = last_draw = time.perf_counter()
        samples = 0
        try:
            for item in self.iterable:
                yield item
                samples += batch_samples(item) * self.world_size
                bar.update(1)
                now = time.perf_counter()
                if now - last_draw >= self.refresh:
                    last_draw = now
                    logged = self.logged()
                    loss = None if "loss" in logged else self.last_loss()
                    postfix = {"samples/s": f"{samples / max(now - start, 1e-9):.0f}"}
                    if loss is not None:
                        postfix["loss"] = f"{loss.item():.4f}"
                    postfix.update((name, f"{value:.4g}") for name, value in logged.items())
                    bar.set_postfix(postfix, refresh=False)
        finally:
            bar.close()
