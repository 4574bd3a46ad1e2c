"""Checkpoint at the end of every epoch, on every rank."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    loss = F.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch.save(model.module.state_dict(), "checkpoint.pt")  # expect: save-every-rank
