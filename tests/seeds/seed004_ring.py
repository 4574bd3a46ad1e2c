"""Seed 004's ``main_worker`` with the four-line ringtrain change, started by ``rt.spawn``.

No ip/port, no ``init_process_group``, no ``set_device``, no samplers, and no
``batch_size / nprocs``: ``ring.loader``'s batch_size is per device (the global batch is
printed), a new order every epoch, and the test set evaluated once per sample.

    python seed004_ring.py                   # one process per GPU, or 2 on a CPU
"""

import argparse

import torch
from torch import nn

import _toy
import ringtrain as rt

parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", default=8, type=int, help="per device")
parser.add_argument("--lr", default=0.5, type=float)
parser.add_argument("--epochs", default=6, type=int)


def main_worker(local_rank, nprocs, args):
    ring = rt.Ring()
    model = _toy.Net()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model, optimizer = ring.setup(model, optimizer)
    trainloader = ring.loader(_toy.dataset(), batch_size=args.batch_size, shuffle=True)
    testloader = ring.loader(_toy.dataset(16), batch_size=args.batch_size, exact=True)

    losses = []
    for epoch in ring.epochs(args.epochs):
        total = 0.0
        for images, target in trainloader:
            loss = criterion(model(images), target)
            ring.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            total += loss.item()
        losses.append(ring.all_reduce(total / len(trainloader)).item())
        ring.print(f"epoch {epoch} loss {losses[-1]:.4f}")
    model.eval()
    with torch.no_grad():
        correct = sum((model(x).argmax(1) == y).sum().item() for x, y in testloader)
    accuracy = ring.all_reduce(correct, op="sum").item() / 16  # exact: each test sample counted once
    ring.print(f"test accuracy {accuracy:.3f}")
    _toy.report(model, losses, ring.rank)  # test hook
    return accuracy


def main():
    args = parser.parse_args()
    nprocs = torch.cuda.device_count() or 2  # one process per GPU; 2 on a CPU
    rt.spawn(main_worker, nprocs=nprocs, args=(nprocs, args))


if __name__ == "__main__":
    main()
