"""FSDP2 trained, then saved the single-process way, on every rank, to one file."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
for layer in model:
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(100):
    loss = F.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 2, (8,)))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
torch.save(model.state_dict(), "model.pt")  # expect: save-sharded-every-rank
torch.save(optimizer.state_dict(), "optimizer.pt")  # expect: save-sharded-every-rank
