"""Seed 002's gradient accumulation with ringtrain: ``Ring(accumulate=k)`` divides the loss,
steps the optimizer every k-th backward only, and under DDP skips the gradient all-reduce
on the other k-1 (the seed's loop, run on several GPUs, would all-reduce every time).

    python seed002_accumulate_ring.py                                  # 8 x 1 process x 4 = 32
    ringtrain run --nproc-per-node 2 seed002_accumulate_ring.py --fit 4    # 4 x 2 processes x 4 = 32
"""

import argparse

import torch
import torch.nn.functional as F

import _toy
import ringtrain as rt

parser = argparse.ArgumentParser()
parser.add_argument("--fit", type=int, default=8, help="samples per device per backward (BATCH_FIT_IN_MEMORY)")
parser.add_argument("--accumulate", type=int, default=4)
args = parser.parse_args()

ring = rt.Ring(accumulate=args.accumulate)
network = _toy.Net()
optim = torch.optim.SGD(network.parameters(), lr=0.5)
network, optim = ring.setup(network, optim)
dataloader = ring.loader(_toy.dataset(), batch_size=args.fit)  # prints the global batch

losses = []
for epoch in ring.epochs(6):
    total = 0.0
    for imgs, labels in dataloader:
        loss = F.cross_entropy(network(imgs), labels)
        ring.backward(loss)  # loss / 4; DDP's all-reduce only on the 4th
        optim.step()  # steps on the 4th only
        optim.zero_grad()
        total += loss.item()
    losses.append(ring.all_reduce(total / len(dataloader)).item())
    ring.print(f"epoch {epoch} loss {losses[-1]:.4f}")
_toy.report(network, losses, ring.rank)  # test hook
