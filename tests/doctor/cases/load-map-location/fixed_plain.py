"""Fixed: every rank maps the checkpoint onto its own GPU."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
model = torch.nn.Linear(4, 2).cuda()
model = DDP(model, device_ids=[local_rank])
state = torch.load("checkpoint.pt", map_location=f"cuda:{local_rank}")
model.module.load_state_dict(state["model"])
