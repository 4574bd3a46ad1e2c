"""Seed 002, "积累梯度" (gradient accumulation): several backward passes, one optimizer step,
the loss divided by the number of passes -- one GPU trains with a batch it cannot hold.

One process, as the seed runs it:
    python seed002_accumulate.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader

import _toy

TARGET_BATCH_SIZE, BATCH_FIT_IN_MEMORY = 32, 8  # the seed: 256, 32 (smaller for a CPU test)
accumulation_steps = int(TARGET_BATCH_SIZE / BATCH_FIT_IN_MEMORY)


def main():
    network = _toy.Net()
    optim = torch.optim.SGD(network.parameters(), lr=0.5)
    loss_function = nn.CrossEntropyLoss()
    dataloader = DataLoader(_toy.dataset(), batch_size=BATCH_FIT_IN_MEMORY)

    losses = []
    for epoch in range(6):  # the seed shows one pass
        total = 0.0
        network.zero_grad()  # Reset gradients tensors
        for i, (imgs, labels) in enumerate(dataloader):
            preds = network(imgs)  # Forward pass
            loss = loss_function(preds, labels)  # Compute loss function
            total += loss.item()
            loss = loss / accumulation_steps  # Normalize our loss (if averaged)
            loss.backward()  # Backward pass
            if (i + 1) % accumulation_steps == 0:  # Wait for several backward steps
                optim.step()  # Perform an optimizer step
                network.zero_grad()  # Reset gradients tensors
        losses.append(total / len(dataloader))
        print(f"epoch {epoch} loss {losses[-1]:.4f}")
    _toy.report(network, losses)  # test hook


if __name__ == "__main__":
    main()
