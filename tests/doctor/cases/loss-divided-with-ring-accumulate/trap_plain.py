"""A single-GPU accumulation loop moved to ringtrain: Ring(accumulate=k), but the loss is still divided
by k before ring.backward, which divides it again."""
import argparse

import torch
import torch.nn.functional as F

import ringtrain as rt

parser = argparse.ArgumentParser()
parser.add_argument("--accumulate", type=int, default=4)
args = parser.parse_args()

ring = rt.Ring(accumulate=args.accumulate)
model = torch.nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = ring.setup(model, optimizer)
loader = ring.loader(torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,))),
                     batch_size=8, shuffle=True)
for epoch in ring.epochs(3):
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        loss = loss / args.accumulate  # expect: loss-divided-with-ring-accumulate
        ring.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
