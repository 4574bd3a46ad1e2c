"""Seed 000, "torch.nn.DataParallel()" (seed 002's "使用nn.DataParallel" is the same calls).

The seed's block wraps the model and moves it to the GPU:
    model = NET(); model = torch.nn.DataParallel(); mode.cuda()
(two typos there: DataParallel() is given no model, and `mode` is `model`). DataParallel
splits each batch over the visible GPUs, so the seed's note says to multiply batch_size
by the number of GPUs to keep one GPU's batch. The rest is the single-GPU loop.

Started as the seed starts it, one process:
    python seed000_dataparallel.py
"""

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import _toy

EPOCHS = 6
BATCH = 16  # the global batch: DataParallel cuts it into one chunk per GPU


def main():
    model = _toy.Net()
    model = torch.nn.DataParallel(model)  # the seed's line, with the model it forgot
    if torch.cuda.is_available():  # CPU: no .cuda(); without GPUs DataParallel runs the module as it is
        model.cuda()
    device = next(model.parameters()).device
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(_toy.dataset(), batch_size=BATCH, shuffle=False)

    losses = []
    for epoch in range(EPOCHS):
        total = 0.0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        losses.append(total / len(loader))
        print(f"epoch {epoch} loss {losses[-1]:.4f}")
    _toy.report(model, losses)  # test hook


if __name__ == "__main__":
    main()
