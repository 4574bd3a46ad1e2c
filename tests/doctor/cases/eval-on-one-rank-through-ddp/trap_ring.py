"""ringtrain: ring.setup's model is DDP's wrapper on several processes; the test after training runs it on
the main process only with gradients on (no torch.no_grad): every such forward broadcasts the buffers, a
collective the others, gone on to ring.save, never join."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import ringtrain as rt


def test(model, loader):
    model.eval()
    correct = 0
    for x, y in loader:
        correct += (model(x).argmax(1) == y).sum().item()  # expect: eval-on-one-rank-through-ddp
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
