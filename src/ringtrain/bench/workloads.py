"""The benchmark's workloads: a model, its data, its loss and its quality metric, at two sizes.

Every workload is built the same way on every rank (seeded, nothing downloaded), so
all modes train the identical model on the identical samples. Models that can be cut
into pipeline stages are written as ``nn.Sequential`` (the same layers as the classes in
models.py) and name their split point; the U-Net's skip connections cannot be cut.

``quick`` sizes are what ``ringtrain bench --quick`` runs on a 2-core CPU; the full
sizes are the real thing (CIFAR-100-sized data, the standard ResNet-18 width).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from ..errors import RingtrainError
from . import datasets
from .models import ResNet18, UNet3D
from .names import WITH_BATCHNORM, WORKLOADS  # noqa: F401 - the bench's names live there (no torch)

NO_PIPELINE = {"unet3d": "the U-Net's skip connections join each level to the far end of the network, so it is "
                         "no nn.Sequential to cut into pipeline stages"}


@dataclass
class Workload:
    name: str
    describe: str  # one line for the report header
    make_model: Callable[[], nn.Module]
    train: TensorDataset
    test: TensorDataset
    global_batch: int
    lr: float
    metric_name: str  # "accuracy" or "dice"
    split_at: list[str] | None = None  # pipeline split point(s) of the Sequential; None = cannot be cut (NO_PIPELINE)
    model_name: str = ""  # the "model" and "dataset" columns of the tutorial-shaped table
    data_name: str = ""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.make_model().parameters())

    def trimmed(self) -> "Workload":
        """Drop the train set's tail so it is a whole number of global batches.

        Then every world size and accumulation factor splits each epoch into the same
        optimizer steps, DistributedSampler pads nothing, and every mode sees the same samples.
        """
        n = len(self.train) // self.global_batch * self.global_batch
        if n == 0:
            raise RingtrainError(
                f"workload {self.name!r} has {len(self.train)} training samples, fewer than one global batch "
                f"of {self.global_batch}",
                "lower --batch-size or raise --samples.",
            )
        x, y = self.train.tensors
        self.train = TensorDataset(x[:n], y[:n])
        return self

    def evaluate(self, model: nn.Module, device: torch.device, batch: int = 256) -> float:
        """Held-out accuracy (classification) or foreground Dice (segmentation) of ``model``."""
        x, y = self.test.tensors
        was_training = model.training
        model.eval()
        hits = total = inter = pred_fg = true_fg = 0.0
        with torch.no_grad():
            for i in range(0, len(x), batch):
                pred = model(x[i : i + batch].to(device)).float().argmax(1).cpu()
                target = y[i : i + batch]
                hits += (pred == target).sum().item()
                total += target.numel()
                inter += ((pred == 1) & (target == 1)).sum().item()
                pred_fg += (pred == 1).sum().item()
                true_fg += (target == 1).sum().item()
        model.train(was_training)
        if self.metric_name == "dice":
            return 2 * inter / max(pred_fg + true_fg, 1.0)
        return hits / max(total, 1.0)


def _digits_cnn(width: int) -> nn.Sequential:
    # models.DigitsCNN's layers, as a Sequential so the pipeline mode can cut it at the flatten.
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * width * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def _mlp(inputs: int, hidden: int, layers: int) -> nn.Sequential:
    dims = [inputs] + [hidden] * layers
    body = [m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.ReLU())]
    return nn.Sequential(nn.Flatten(), *body, nn.Linear(hidden, 10))


def _resnet18(width: int, classes: int = 100) -> nn.Sequential:
    # models.ResNet18's modules in order. Its four stages cost about the same FLOPs
    # (each halves the resolution and doubles the channels), so the cut after the
    # second stage ("5") balances two pipeline stages.
    net = ResNet18(num_classes=classes, width=width)
    return nn.Sequential(net.conv1, net.bn1, nn.ReLU(), *net.layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), net.fc)


def default_batch(name: str, quick: bool) -> int:
    """The global batch ``build`` uses when none is given."""
    return {"digits-cnn": 64, "mlp": 128 if quick else 256, "cifar-resnet18": 64 if quick else 256,
            "unet3d": 16}.get(name, 64)


def build(
    name: str,
    *,
    quick: bool = False,
    width: int | None = None,
    samples: int | None = None,
    batch_size: int | None = None,
    data: str | None = None,
) -> Workload:
    """The workload ``name`` at quick or full size; ``width``/``samples``/``batch_size`` override the size's defaults."""
    if name not in WORKLOADS:
        raise RingtrainError(f"unknown workload {name!r}", f"use one of {', '.join(WORKLOADS)}.")
    if data is not None and name != "cifar-resnet18":
        raise RingtrainError(f"--data was given for workload {name!r}", "--data is the cifar-100-python folder of "
                             "--workload cifar-resnet18; the other workloads bring their own data.")
    if name == "digits-cnn":
        w = width or 32
        train, test = datasets.digits()
        if samples:
            train = TensorDataset(*(t[:samples] for t in train.tensors))
        wl = Workload(name, f"DigitsCNN (width {w}) on scikit-learn's real 8x8 digits", lambda: _digits_cnn(w),
                      train, test, batch_size or default_batch(name, quick), 0.05, "accuracy", split_at=["5"],
                      model_name=f"DigitsCNN (width {w})", data_name="scikit-learn digits")
    elif name == "mlp":
        hidden, layers = width or 1024, 3 if quick else 4
        n = samples or (2048 if quick else 16384)
        train = datasets.synthetic_vectors(n + 1024, features=256)
        x, y = train.tensors
        wl = Workload(name, f"MLP 256-{hidden}x{layers}-10 on synthetic vectors (communication-bound)",
                      lambda: _mlp(256, hidden, layers), TensorDataset(x[:n], y[:n]),
                      TensorDataset(x[n:], y[n:]), batch_size or default_batch(name, quick), 0.02, "accuracy",
                      split_at=[str(1 + 2 * (layers // 2))], model_name=f"MLP 256-{hidden}x{layers}-10",
                      data_name="synthetic vectors")
    elif name == "cifar-resnet18":
        w = width or (8 if quick else 64)
        if data is not None:
            train, test = datasets.cifar100(data, "train"), datasets.cifar100(data, "test")
            if samples:
                train = TensorDataset(*(t[:samples] for t in train.tensors))
            source = f"CIFAR-100 from {data}"
        else:
            n = samples or (1024 if quick else 50000)
            both = datasets.synthetic_images(n + (512 if quick else 10000), classes=100)
            x, y = both.tensors
            train, test = TensorDataset(x[:n], y[:n]), TensorDataset(x[n:], y[n:])
            source = "synthetic CIFAR-100-shaped images"
        wl = Workload(name, f"CIFAR ResNet-18 (width {w}) on {source}", lambda: _resnet18(w), train, test,
                      batch_size or default_batch(name, quick), 0.05, "accuracy", split_at=["5"],
                      model_name=f"ResNet-18 (width {w})",
                      data_name="CIFAR-100" if data is not None else "synthetic CIFAR-100-shaped")
    else:  # unet3d
        base, side = width or (8 if quick else 16), 16 if quick else 32
        n = samples or (128 if quick else 512)
        both = datasets.synthetic_volumes(n + (32 if quick else 128), side=side)
        x, y = both.tensors
        wl = Workload(name, f"3D U-Net (base {base}) segmenting synthetic {side}^3 volumes",
                      lambda: UNet3D(1, 2, base=base, depth=2), TensorDataset(x[:n], y[:n]),
                      TensorDataset(x[n:], y[n:]), batch_size or default_batch(name, quick), 0.05, "dice",
                      model_name=f"3D U-Net (base {base})", data_name=f"synthetic {side}^3 volumes")
    return wl.trimmed()


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
