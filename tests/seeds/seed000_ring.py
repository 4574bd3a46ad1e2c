"""Seed 000's DDP script with the four-line ringtrain change.

No ``--local_rank``, no ``set_device``, no ``init_process_group`` arguments, no sampler:
``rt.Ring()`` reads whoever started the process — ``ringtrain run``, ``torchrun``, the old
``torch.distributed.launch``, or, as in the seed's "env://" section, processes started by
hand with only MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK set:
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=0 python seed000_ring.py &
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=1 python seed000_ring.py
"""

import argparse

import torch
import torch.nn.functional as F

import _toy
import ringtrain as rt

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=6)
args = parser.parse_args()

ring = rt.Ring()
model = _toy.Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
model, optimizer = ring.setup(model, optimizer)
train = ring.loader(_toy.dataset(), batch_size=8, shuffle=True)

losses = []
for epoch in ring.epochs(args.epochs):
    total = 0.0
    for x, y in train:
        loss = F.cross_entropy(model(x), y)
        ring.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        total += loss.item()
    losses.append(ring.all_reduce(total / len(train)).item())
    ring.print(f"epoch {epoch} loss {losses[-1]:.4f} (world size {ring.world_size}, {ring.env.name})")
_toy.report(model, losses, ring.rank)  # test hook
