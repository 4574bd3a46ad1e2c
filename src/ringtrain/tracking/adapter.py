"""What every backend a run's numbers go to does: one small adapter per backend, over its own library.

``metrics.csv`` is always written (table.py, no dependency). The others are the backends' own
libraries, imported only when used: TensorBoard's ``SummaryWriter`` whenever ``tensorboard`` is
installed; W&B and MLflow when installed and asked for (``Ring(log_with=["wandb", "mlflow"])``). An
adapter is made once, on the main process, when the first value is logged; nothing here re-implements
a backend's file format or protocol.
"""

from __future__ import annotations

import importlib
import importlib.util
from abc import ABC, abstractmethod

from ..errors import RingtrainError, extra_hint

# name -> (module with the adapter, the package it needs, the pip line that installs it)
BACKENDS = {
    "tensorboard": ("to_tensorboard", "tensorboard", extra_hint("tensorboard", "track").rstrip(".")),
    "wandb": ("to_wandb", "wandb", "pip install wandb"),
    "mlflow": ("to_mlflow", "mlflow", "pip install mlflow-skinny (or mlflow)"),
}


class Adapter(ABC):
    """One backend of one run folder. ``resume_step``: the optimizer step the run continues from (rows
    logged past it by the run that was cut off are superseded), or None for a run that starts fresh."""

    @abstractmethod
    def write(self, step: int, values: dict[str, float], wall_time: float) -> None:
        """Record ``values`` at ``step`` (called at the user's logging frequency, on the main process)."""

    @abstractmethod
    def close(self) -> None:
        """Put everything on disk (or send it) and let the backend go."""


def installed(name: str) -> bool:
    return importlib.util.find_spec(BACKENDS[name][1]) is not None


def backends(asked: tuple[str, ...] | list[str] | str) -> list[str]:
    """The backends a run writes to besides metrics.csv: TensorBoard when installed, plus those asked for —
    each checked now, before any process group forms."""
    asked = [asked] if isinstance(asked, str) else list(asked)
    for name in asked:
        if name not in BACKENDS:
            raise RingtrainError(f"Ring got log_with={asked!r}: no backend {name!r}",
                                 f"use some of {sorted(BACKENDS)} (metrics.csv is always written).")
        if not installed(name):
            raise RingtrainError(f"Ring got log_with={asked!r}, but {BACKENDS[name][1]!r} is not installed",
                                 f"{BACKENDS[name][2]}, or leave {name!r} out of log_with.")
    chosen = ["tensorboard"] if installed("tensorboard") else []
    return chosen + [n for n in dict.fromkeys(asked) if n not in chosen]


def make(name: str, folder: str, resume_step: int | None) -> Adapter:
    module = importlib.import_module(f"{__package__}.{BACKENDS[name][0]}")
    return module.ADAPTER(folder, resume_step)
