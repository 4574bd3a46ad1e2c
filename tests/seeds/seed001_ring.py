"""Seed 001's Horovod script with the four-line ringtrain change: the same Horovod machinery
(gradients averaged as backward runs, fp16 compression, accumulation) as a strategy object.

    ringtrain run --nproc-per-node 2 seed001_ring.py --fp16_allreduce --batches_per_allreduce 2
    ringtrain run --horovod -np 2 -H IP1:1,IP2:1 python seed001_ring.py     (the seed's command works too)
"""

import argparse

import torch
import torch.nn.functional as F

import _toy
import ringtrain as rt

parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--base_lr", type=float, default=1.0)
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--fp16_allreduce", action="store_true")
parser.add_argument("--batches_per_allreduce", type=int, default=1)
args = parser.parse_args()

ring = rt.Ring(strategy=rt.strategies.Horovod(compression="fp16" if args.fp16_allreduce else "none"),
               accumulate=args.batches_per_allreduce)
model = _toy.Net()
optimizer = _toy.LARS(model.parameters(), lr=args.base_lr, momentum=0.9)
model, optimizer = ring.setup(model, optimizer)  # broadcast from rank 0 included
train_loader = ring.loader(_toy.dataset(), batch_size=args.batch_size, shuffle=True, drop_last=True)

losses = []
for epoch in ring.epochs(args.epochs):  # set_epoch done: a new order every epoch
    total = 0.0
    for images, target in train_loader:
        loss = F.cross_entropy(model(images), target)
        ring.backward(loss)  # divided by the window; reduced once per window
        optimizer.step()
        optimizer.zero_grad()
        total += loss.item()
    losses.append(ring.all_reduce(total / len(train_loader)).item())
    ring.print(f"epoch {epoch} loss {losses[-1]:.4f} ({ring.world_size} workers)")
_toy.report(model, losses, ring.rank)  # test hook
