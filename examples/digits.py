"""Train a small CNN on scikit-learn's real handwritten digits — one script, any number of processes.

Launch:
    python examples/digits.py                                  # one process
    ringtrain run --nproc-per-node 2 examples/digits.py        # DDP, 2 processes (what `make demo` runs)
    torchrun --nproc-per-node 2 examples/digits.py             # the same, through torchrun

Prints held-out accuracy (every sample evaluated exactly once across ranks), saves a
checkpoint that plain PyTorch can load: torch.load(path)["model"], and logs the loss
(averaged over the ranks) and the accuracy into OUT/log: metrics.csv, TensorBoard event
files when tensorboard is installed, and the pictures `ringtrain plot OUT/log` draws.
Needs scikit-learn (the digits) and, for the pictures, matplotlib: pip install "ringtrain[bench]".
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F

import ringtrain as rt
from ringtrain.bench.datasets import digits
from ringtrain.bench.models import DigitsCNN


def evaluate(ring: rt.Ring, model: torch.nn.Module, loader) -> float:
    model.eval()
    correct = torch.zeros((), device=ring.device)
    count = torch.zeros((), device=ring.device)
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum()
            count += len(y)
    model.train()
    # exact=True shards have no padded duplicates, so these sums count each sample once.
    return (ring.all_reduce(correct, op="sum") / ring.all_reduce(count, op="sum")).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per process per step")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--out", default="runs/digits", help="folder for the checkpoint")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="auto: one GPU per process when there are enough, else the CPU")
    args = parser.parse_args()

    ring = rt.Ring(seed=0, device=args.device, log_dir=os.path.join(args.out, "log"))
    train_set, test_set = digits()
    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    model, optimizer = ring.setup(model, optimizer)
    train = ring.loader(train_set, batch_size=args.batch_size, shuffle=True)
    test = ring.loader(test_set, batch_size=256, exact=True)
    ring.print(f"{ring.world_size} process(es) on {ring.device}; {len(train_set)} train / {len(test_set)} test digits")

    if ring.is_main:
        os.makedirs(args.out, exist_ok=True)
    ring.barrier()
    accuracy = 0.0
    for epoch in ring.epochs(args.epochs):
        for x, y in ring.progress(train, desc=f"epoch {epoch}"):
            loss = F.cross_entropy(model(x), y)
            ring.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if ring.optimizer_steps % 5 == 0:
                ring.log({"loss": loss})  # the mean over all ranks, written once by rank 0
        accuracy = evaluate(ring, model, test)
        ring.log({"held_out_accuracy": accuracy}, reduce=None)  # already the whole job's (summed over ranks)
        ring.print(f"epoch {epoch}: held-out accuracy {accuracy:.4f}")
        ring.save(os.path.join(args.out, "checkpoint.pt"), model=model, optimizer=optimizer, epoch=epoch)
    ring.print(f"final held-out accuracy {accuracy:.4f}; checkpoint {os.path.join(args.out, 'checkpoint.pt')}")
    ring.close()
    if ring.is_main:
        from ringtrain.tracking.plot import plot

        try:
            ring.print("pictures: " + ", ".join(plot(os.path.join(args.out, "log"))))
        except rt.RingtrainError as e:  # no matplotlib: the message names the extra that brings it
            ring.print(f"no pictures: {e}")


if __name__ == "__main__":
    main()
