"""Fixed: each process pins its GPU before the group starts."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
device = torch.device("cuda", local_rank)
model = DDP(torch.nn.Linear(4, 2).to(device), device_ids=[local_rank])
stats = torch.zeros(2).cuda()
dist.all_reduce(stats)
