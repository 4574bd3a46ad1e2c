"""Step 2: the same script with ringtrain — one device, or DDP on any number of processes.

Launch:
    python examples/02_ddp.py                                   # one process
    ringtrain run --nproc-per-node 2 examples/02_ddp.py         # DDP on 2 processes
    torchrun --nproc-per-node 2 examples/02_ddp.py              # the same through torchrun

The diff from 01_single.py: import ringtrain, make a Ring, ring.setup, ring.loader
(sharded, reshuffled every epoch, batches already on the device), ring.epochs,
ring.backward, exact evaluation summed over ranks, ring.log (the loss averaged over
all ranks, not rank 0's shard of the batch, into runs/02_ddp-TIME/: metrics.csv,
TensorBoard; `ringtrain plot RUN_DIR` draws it), ring.print and ring.save.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import ringtrain as rt
from ringtrain.bench.datasets import digits


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def accuracy(ring, model, loader) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
    model.train()
    # exact=True: each sample was evaluated on exactly one rank, so sums are exact.
    return ring.all_reduce(correct, op="sum").item() / ring.all_reduce(total, op="sum").item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    args = parser.parse_args()

    ring = rt.Ring(seed=0)
    train_set, test_set = digits()
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    model, optimizer = ring.setup(model, optimizer)
    train = ring.loader(train_set, batch_size=args.batch_size, shuffle=True)
    test = ring.loader(test_set, batch_size=256, exact=True)

    for epoch in ring.epochs(args.epochs):
        for x, y in ring.progress(train, desc=f"epoch {epoch}"):
            loss = F.cross_entropy(model(x), y)
            ring.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if ring.optimizer_steps % 10 == 0:
                ring.log({"loss": loss})  # the mean over all ranks, written once
        logged = ring.log({"held_out_accuracy": accuracy(ring, model, test)})
        ring.print(f"epoch {epoch}: held-out accuracy {logged['held_out_accuracy']:.4f}")
    ring.save("digits_ddp.pt", model=model, optimizer=optimizer, epoch=epoch)


if __name__ == "__main__":
    main()
