"""Data the examples and benchmarks use: real digits, CIFAR-100 from a folder, or synthetic.

Nothing here downloads: scikit-learn ships the digits; CIFAR-100 is read from the
standard python-format folder the user already has (``train`` / ``test`` pickles).
"""

from __future__ import annotations

import os
import pickle

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ..errors import RingtrainError, import_extra
from .names import EXTRA


def digits(test_fraction: float = 0.2, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's 1,797 real 8x8 handwritten digits, split into train and held-out test."""
    data = import_extra("sklearn.datasets", EXTRA, "the digits data set").load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = (x - 0.5) / 0.5
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def synthetic_images(n: int, shape=(3, 32, 32), classes: int = 100, seed: int = 0) -> TensorDataset:
    """Random images around one fixed prototype per class, so a model has something to learn."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(classes, *shape, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    x = prototypes[y] * 0.5 + torch.randn(n, *shape, generator=g)
    return TensorDataset(x, y)


_CIFAR_MEAN = torch.tensor([0.5071, 0.4865, 0.4409]).view(1, 3, 1, 1)
_CIFAR_STD = torch.tensor([0.2673, 0.2564, 0.2762]).view(1, 3, 1, 1)


def cifar100(folder: str, split: str = "train") -> TensorDataset:
    """CIFAR-100 from the standard python-format folder (``cifar-100-python/{train,test}``)."""
    path = os.path.join(folder, split)
    if not os.path.isfile(path):
        raise RingtrainError(
            f"no CIFAR-100 file {path!r}",
            "point --data at the extracted 'cifar-100-python' folder (it holds 'train' and 'test'); "
            "nothing is downloaded.",
        )
    with open(path, "rb") as f:
        # The CIFAR files are pickles of plain arrays; read them only from a source you trust.
        raw = pickle.load(f, encoding="latin1")
    x = torch.tensor(np.asarray(raw["data"], dtype=np.uint8).reshape(-1, 3, 32, 32), dtype=torch.float32) / 255.0
    x = (x - _CIFAR_MEAN) / _CIFAR_STD
    return TensorDataset(x, torch.tensor(raw["fine_labels"], dtype=torch.long))


def synthetic_vectors(n: int, features: int = 256, classes: int = 10, seed: int = 0) -> TensorDataset:
    """Feature vectors around one fixed prototype per class (the MLP workload's data)."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(classes, features, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return TensorDataset(prototypes[y] * 0.5 + torch.randn(n, features, generator=g), y)


def synthetic_volumes(n: int, side: int = 32, balls: int = 3, seed: int = 0) -> TensorDataset:
    """Noisy 1-channel volumes with a few bright balls; the target is the per-voxel ball mask (0/1).

    A stand-in for a 3D segmentation set (organ/tumour masks on CT or MRI), generated, not downloaded.
    """
    g = torch.Generator().manual_seed(seed)
    axis = torch.arange(side, dtype=torch.float32)
    grid = torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"))  # (3, D, H, W)
    centres = torch.rand(n, balls, 3, 1, 1, 1, generator=g) * side
    radii = side * (0.1 + 0.15 * torch.rand(n, balls, 1, 1, 1, generator=g))
    mask = torch.zeros(n, side, side, side, dtype=torch.bool)
    for b in range(balls):
        mask |= ((grid.unsqueeze(0) - centres[:, b]) ** 2).sum(1) <= radii[:, b] ** 2
    x = mask.float().unsqueeze(1) + 0.6 * torch.randn(n, 1, side, side, side, generator=g)
    return TensorDataset(x, mask.long())
