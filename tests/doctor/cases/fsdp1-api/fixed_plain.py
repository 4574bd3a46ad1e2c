"""Fixed: FSDP2 — each block, then the model, sharded with fully_shard; offloading by policy."""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10)).to(local_rank)
for layer in (model[0], model[2]):
    fully_shard(layer, reshard_after_forward=True, offload_policy=CPUOffloadPolicy())
fully_shard(model, reshard_after_forward=True, offload_policy=CPUOffloadPolicy())
optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
for step in range(10):
    loss = F.cross_entropy(model(torch.randn(64, 784, device=local_rank)), torch.randint(0, 10, (64,), device=local_rank))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
