"""CIFAR-style ResNet-18 on CIFAR-100 — the network every DDP tutorial benchmarks.

Launch:
    python examples/cifar_resnet.py --steps 20                          # one process, synthetic data
    ringtrain run --nproc-per-node 2 examples/cifar_resnet.py           # DDP on 2 processes
    ringtrain run --nproc-per-node gpu examples/cifar_resnet.py --data ~/data/cifar-100-python --epochs 30

Synthetic CIFAR-100-shaped data by default (nothing is downloaded). With
``--data DIR`` it reads the standard python-format folder (``DIR/train``,
``DIR/test``). ``--width`` shrinks the network for quick CPU runs.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F

import ringtrain as rt
from ringtrain.bench.datasets import cifar100, synthetic_images
from ringtrain.bench.models import ResNet18


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="cifar-100-python folder; synthetic data when omitted")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0, help="stop each epoch after this many steps (0: whole epoch)")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per process per step")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--width", type=int, default=64, help="64 is the standard ResNet-18")
    parser.add_argument("--synthetic-size", type=int, default=2048)
    parser.add_argument("--out", default="runs/cifar_resnet")
    args = parser.parse_args()

    ring = rt.Ring(seed=0)
    if args.data:
        train_set, test_set = cifar100(args.data, "train"), cifar100(args.data, "test")
    else:
        train_set = synthetic_images(args.synthetic_size, seed=0)
        test_set = synthetic_images(max(args.synthetic_size // 4, ring.world_size), seed=1)
    model = ResNet18(num_classes=100, width=args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    model, optimizer = ring.setup(model, optimizer)
    train = ring.loader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True)
    test = ring.loader(test_set, batch_size=256, exact=True)
    ring.print(f"ResNet-18 (width {args.width}) on {ring.world_size} process(es), {ring.device}")

    for epoch in ring.epochs(args.epochs):
        model.train()
        for step, (x, y) in enumerate(ring.progress(train, desc=f"epoch {epoch}")):
            loss = F.cross_entropy(model(x), y)
            ring.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if args.steps and step + 1 >= args.steps:
                break
        model.eval()
        correct = torch.zeros((), device=ring.device)
        with torch.no_grad():
            for x, y in test:
                correct += (model(x).argmax(1) == y).sum()
        accuracy = ring.all_reduce(correct, op="sum").item() / len(test_set)
        ring.print(f"epoch {epoch}: test accuracy {accuracy:.4f}")
    if ring.is_main:
        os.makedirs(args.out, exist_ok=True)
    ring.barrier()
    ring.save(os.path.join(args.out, "checkpoint.pt"), model=model, optimizer=optimizer)
    ring.close()


if __name__ == "__main__":
    main()
