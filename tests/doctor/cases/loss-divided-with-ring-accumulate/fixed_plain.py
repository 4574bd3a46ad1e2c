"""Fixed: the micro-batch loss goes to ring.backward as it is; ring.backward divides it by the window."""
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
        ring.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
