"""Seed 002, "跨GPU的模型拆分" (splitting a model across GPUs): module1 on one GPU, module2 on
another, and the activations moved between them in ``forward``.

One process, as the seed runs it:
    python seed002_split.py
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import _toy

# CPU: two GPUs if there are two, else both halves on the CPU (the seed: .cuda(0) and .cuda(1))
TWO_GPUS = torch.cuda.device_count() >= 2
DEVICE0, DEVICE1 = ("cuda:0", "cuda:1") if TWO_GPUS else ("cpu", "cpu")


class Network(nn.Module):
    def __init__(self, split_gpus=False):
        super().__init__()
        net = _toy.Net()
        self.module1 = net.module1
        self.module2 = net.module2
        self.split_gpus = split_gpus
        if split_gpus:  # considering only two gpus
            self.module1.to(DEVICE0)
            self.module2.to(DEVICE1)

    def forward(self, x):
        if self.split_gpus:
            x = x.to(DEVICE0)
        x = self.module1(x)
        if self.split_gpus:
            x = x.to(DEVICE1)
        x = self.module2(x)
        return x


def main():
    model = Network(split_gpus=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(_toy.dataset(), batch_size=16)
    losses = []
    for epoch in range(6):
        total = 0.0
        for x, y in loader:
            out = model(x)
            loss = F.cross_entropy(out, y.to(out.device))  # the output is on the second device
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        losses.append(total / len(loader))
        print(f"epoch {epoch} loss {losses[-1]:.4f}")
    _toy.report(model, losses)  # test hook


if __name__ == "__main__":
    main()
