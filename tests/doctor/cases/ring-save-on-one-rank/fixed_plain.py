"""The same script calling ring.load and ring.save on every rank (ring.save writes once, on rank 0); only the
print stays under the rank check."""
import os

import torch
import torch.nn.functional as F

import ringtrain as rt

ring = rt.Ring(seed=0)
model = torch.nn.Linear(16, 4)
model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
if os.path.exists("last.pt"):
    ring.load("last.pt", model=model, optimizer=optimizer)
loader = ring.loader(torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,))),
                     batch_size=8, shuffle=True)
for epoch in ring.epochs(3):
    for x, y in loader:
        ring.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    if ring.is_main:
        print(f"epoch {epoch} done")
    ring.save("last.pt", model=model, optimizer=optimizer)
