"""NCCL, explicit devices for the model, but no current device: .cuda() lands on GPU 0."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("nccl")  # expect: set-device
device = torch.device("cuda", local_rank)
model = DDP(torch.nn.Linear(4, 2).to(device), device_ids=[local_rank])
stats = torch.zeros(2).cuda()
dist.all_reduce(stats)
