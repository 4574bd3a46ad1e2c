"""Fixed by moving to DDP: one process per GPU, the global batch of 256 kept by dividing it."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
model = DDP(nn.Linear(4, 2).cuda(), device_ids=[local_rank])
dataset = TensorDataset(torch.randn(1024, 4))
loader = DataLoader(dataset, batch_size=256 // dist.get_world_size(), sampler=DistributedSampler(dataset))
