"""Small models written here (no torchvision on CPU-only installs, no downloads)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DigitsCNN(nn.Module):
    """A small CNN for 8x8 single-channel digits (scikit-learn's load_digits)."""

    def __init__(self, num_classes: int = 10, width: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc1 = nn.Linear(2 * width * 4 * 4, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class MLP(nn.Module):
    """A plain MLP; with wide layers it is communication-bound under DDP."""

    def __init__(self, inputs: int = 64, hidden: int = 256, layers: int = 2, outputs: int = 10):
        super().__init__()
        dims = [inputs] + [hidden] * layers
        self.body = nn.Sequential(*[m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.ReLU())])
        self.head = nn.Linear(dims[-1], outputs)

    def forward(self, x):
        return self.head(self.body(x.flatten(1)))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inputs: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """CIFAR-style ResNet-18 (He et al. 2016): 3x3 stem, no max-pool, 4 stages of 2 blocks.

    ``width`` scales every stage (64 is the standard network, ~11.2M parameters
    for 100 classes); small widths keep CPU tests fast.
    """

    def __init__(self, num_classes: int = 100, width: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        stages, inputs = [], width
        for i, stride in enumerate((1, 2, 2, 2)):
            planes = width * 2**i
            stages.append(nn.Sequential(BasicBlock(inputs, planes, stride), BasicBlock(planes, planes, 1)))
            inputs = planes
        self.layers = nn.Sequential(*stages)
        self.fc = nn.Linear(inputs, num_classes)

    def forward(self, x):
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


def _conv3d_block(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv3d(inputs, outputs, 3, padding=1, bias=False), nn.BatchNorm3d(outputs), nn.ReLU(inplace=True),
        nn.Conv3d(outputs, outputs, 3, padding=1, bias=False), nn.BatchNorm3d(outputs), nn.ReLU(inplace=True),
    )


class UNet3D(nn.Module):
    """A small 3D U-Net (Çiçek et al. 2016) for volumetric segmentation, as in the medical-imaging tutorials.

    ``depth`` down-sampling levels (each halves every side, so the volume side must be a
    multiple of 2**depth); ``base`` channels at the top level, doubled per level.
    Returns per-voxel class logits ``(N, classes, D, H, W)``.
    """

    def __init__(self, in_channels: int = 1, classes: int = 2, base: int = 8, depth: int = 2):
        super().__init__()
        widths = [base * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList()
        inputs = in_channels
        for w in widths[:-1]:
            self.down.append(_conv3d_block(inputs, w))
            inputs = w
        self.bottom = _conv3d_block(widths[-2], widths[-1])
        self.upsample = nn.ModuleList()
        self.up = nn.ModuleList()
        for deep, w in zip(widths[:0:-1], widths[-2::-1]):
            self.upsample.append(nn.ConvTranspose3d(deep, w, 2, stride=2))
            self.up.append(_conv3d_block(2 * w, w))
        self.head = nn.Conv3d(widths[0], classes, 1)

    def forward(self, x):
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool3d(x, 2)
        x = self.bottom(x)
        for upsample, block, skip in zip(self.upsample, self.up, reversed(skips)):
            x = block(torch.cat([upsample(x), skip], dim=1))
        return self.head(x)
