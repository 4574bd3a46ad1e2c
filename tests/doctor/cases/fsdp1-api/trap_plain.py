"""FSDP1 the way the 2022 FSDP tutorial teaches it: a size-based wrap policy and the wrapper class."""
import functools
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import CPUOffload, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
policy = functools.partial(size_based_auto_wrap_policy, min_num_params=20000)
model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10)).to(local_rank)
model = FSDP(model, auto_wrap_policy=policy, sharding_strategy=ShardingStrategy.FULL_SHARD,  # expect: fsdp1-api
             cpu_offload=CPUOffload(offload_params=True))
optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
for step in range(10):
    loss = F.cross_entropy(model(torch.randn(64, 784, device=local_rank)), torch.randint(0, 10, (64,), device=local_rank))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
