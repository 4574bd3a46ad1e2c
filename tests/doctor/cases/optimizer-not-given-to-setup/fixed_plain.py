"""The same script with the optimizer handed to ring.setup, which points it at the shards."""
import torch
import torch.nn.functional as F

import ringtrain as rt

ring = rt.Ring(strategy="fsdp")
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer = ring.setup(model, optimizer)
loader = ring.loader(torch.utils.data.TensorDataset(torch.randn(512, 32), torch.randint(0, 10, (512,))),
                     batch_size=16, shuffle=True)
for epoch in ring.epochs(3):
    for x, y in loader:
        ring.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
