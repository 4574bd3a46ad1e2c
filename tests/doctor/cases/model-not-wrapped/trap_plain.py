"""DDP on the GPU only: the CPU path still forms a (Gloo) group and shards the data."""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

use_cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if use_cuda else "gloo")
local_rank = int(os.environ["LOCAL_RANK"])
model = torch.nn.Linear(4, 2)
if use_cuda:  # expect: model-not-wrapped
    torch.cuda.set_device(local_rank)
    model = DDP(model.cuda(), device_ids=[local_rank])

dataset = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=8, sampler=sampler)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
