"""A single-GPU loop moved to ringtrain half-way: Ring(accumulate=4) and ring.setup, but the backward is still
loss.backward(), so the window never forms and the optimizer steps on every batch."""
import torch
import torch.nn.functional as F

import ringtrain as rt

ring = rt.Ring(accumulate=4)
model = torch.nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = ring.setup(model, optimizer)
loader = ring.loader(torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,))),
                     batch_size=8, shuffle=True)
for epoch in ring.epochs(3):
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # expect: backward-without-ring
        optimizer.step()
        optimizer.zero_grad()
