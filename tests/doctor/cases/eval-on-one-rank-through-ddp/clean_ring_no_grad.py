"""ringtrain: ring.setup's model is DDP's wrapper on several processes, and the main process alone tests it
after training, under torch.no_grad: ringtrain's DDP runs no collective in such a forward (it skips the
buffer broadcast), so the other ranks may go on to ring.save."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import ringtrain as rt


def test(model, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
    return correct / len(loader.dataset)


def main(train_set, test_loader, epochs=3):
    ring = rt.Ring(seed=0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer = ring.setup(model, optimizer)
    train = ring.loader(train_set, batch_size=64, shuffle=True)
    for epoch in ring.epochs(epochs):
        for x, y in train:
            ring.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    if ring.is_main:
        print(f"test accuracy {test(model, test_loader):.4f}")
    ring.save("final.pt", model=model)
