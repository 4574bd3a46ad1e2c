"""The global rank from the launcher's RANK; the local rank only picks the GPU."""
import os

import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", world_size=int(os.environ["WORLD_SIZE"]), rank=int(os.environ["RANK"]))
