"""Accumulation copied from the single-GPU script into a DDP one."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
accumulation_steps = 4
batches = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(16)]
for i, (x, y) in enumerate(batches):
    loss = F.cross_entropy(model(x), y) / accumulation_steps
    loss.backward()  # expect: accumulate-no-sync
    if (i + 1) % accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
