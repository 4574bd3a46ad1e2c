"""Seed 002's gist and its loss-logging follow-up with the four-line ringtrain change.

``ring.reduce`` runs on every rank (the seed calls ``dist.reduce`` on rank 0 only, and the
job waits forever); rank 0 gets the mean, the others ``None``. The optimizer's gradients
are zeroed every step (the gist forgets to).

    ringtrain run --nproc-per-node 2 seed002_gist_ring.py
"""

import torch
import torch.nn.functional as F

import _toy
import ringtrain as rt

ring = rt.Ring()
model = _toy.Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = ring.setup(model, optimizer)
dataloader = ring.loader(_toy.dataset(), batch_size=1, shuffle=True)

reduced = []
for step, (inputs, labels) in enumerate(dataloader):
    loss = F.cross_entropy(model(inputs), labels)
    ring.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    loss_tensor = ring.reduce(loss.detach(), dst=0)  # every rank calls it; None except on rank 0
    if ring.is_main:
        reduced.append(loss_tensor.item())
        if step % 8 == 0:
            print(f"Current batch Loss = {loss_tensor.item():.4f}", flush=True)
_toy.report(model, reduced, ring.rank)  # test hook
