"""Fixed: torch.distributed.checkpoint writes each rank's shards into one folder."""
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
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
dcp.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_id="checkpoint")
