"""Random seeds and deterministic kernels: the same numbers on every run (and every rank)."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> int:
    """Seed python's, numpy's and torch's generators (torch's seeds every CUDA device too); returns ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return seed


def configure_kernels(deterministic: bool, cudnn_benchmark: bool | None) -> None:
    """``deterministic``: torch's deterministic algorithms (an error where none exists);
    ``cudnn_benchmark``: let cuDNN time convolutions for fixed shapes (default: on unless deterministic)."""
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=False)
    if torch.backends.cudnn.is_available():
        torch.backends.cudnn.benchmark = (not deterministic) if cudnn_benchmark is None else cudnn_benchmark
        torch.backends.cudnn.deterministic = deterministic
