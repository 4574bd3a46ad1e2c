"""The same loop with ring.backward: the Ring counts the micro-batches and the optimizer steps once per
window of 4."""
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
        ring.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
