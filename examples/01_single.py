"""Step 1 of the ladder: an ordinary single-device PyTorch script (no ringtrain yet).

Launch:
    python examples/01_single.py

Trains a small CNN with BatchNorm on scikit-learn's real handwritten digits and
prints held-out accuracy. 02_ddp.py is this file with four lines changed.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from ringtrain.bench.datasets import digits


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def accuracy(model, loader, device) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
    model.train()
    return correct / total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_set, test_set = digits()
    model = make_model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    train = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test = DataLoader(test_set, batch_size=256)

    for epoch in range(args.epochs):
        for x, y in train:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        print(f"epoch {epoch}: loss {loss.item():.4f} held-out accuracy {accuracy(model, test, device):.4f}")
    torch.save(model.state_dict(), "digits_single.pt")


if __name__ == "__main__":
    main()
