"""The torch.save habit kept with ring.save: the checkpoint is written under `if ring.is_main:`, and a resume
is read under `if ring.rank == 0:`."""
import os

import torch
import torch.nn.functional as F

import ringtrain as rt

ring = rt.Ring(seed=0)
model = torch.nn.Linear(16, 4)
model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
if os.path.exists("last.pt") and ring.rank == 0:
    ring.load("last.pt", model=model, optimizer=optimizer)  # expect: ring-save-on-one-rank
loader = ring.loader(torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,))),
                     batch_size=8, shuffle=True)
for epoch in ring.epochs(3):
    for x, y in loader:
        ring.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    if ring.is_main:
        print(f"epoch {epoch} done")
        ring.save("last.pt", model=model, optimizer=optimizer)  # expect: ring-save-on-one-rank
