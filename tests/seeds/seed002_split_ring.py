"""Seed 002's two-GPU ``Network`` with ringtrain: the two modules given as a list of stages to
``rt.split`` (no device moves in ``forward``), and the split model data-parallel over processes.

    python seed002_split_ring.py                          # one process, two stages
    ringtrain run --nproc-per-node 2 seed002_split_ring.py    # two processes, two stages each

``rt.split(nn.Sequential(module1, module2), devices=..., at=[1])`` is the same split, by position.
"""

import torch
import torch.nn.functional as F

import _toy
import ringtrain as rt

ring = rt.Ring()
net = _toy.Net()
if torch.cuda.device_count() >= 2 * ring.env.local_world_size:  # two GPUs for each process
    devices = [f"cuda:{2 * ring.local_rank}", f"cuda:{2 * ring.local_rank + 1}"]
else:
    devices = ["cpu", "cpu"]  # CPU: both stages on the CPU
model = rt.split([net.module1, net.module2], devices=devices)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
model, optimizer = ring.setup(model, optimizer)  # DDP over the split model; each stage stays on its device
train = ring.loader(_toy.dataset(), batch_size=8, shuffle=True)

losses = []
for epoch in ring.epochs(6):
    total = 0.0
    for x, y in train:
        out = model(x)
        loss = F.cross_entropy(out, y.to(out.device))
        ring.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        total += loss.item()
    losses.append(ring.all_reduce(total / len(train)).item())
    ring.print(f"epoch {epoch} loss {losses[-1]:.4f}")
_toy.report(model, losses, ring.rank)  # test hook
