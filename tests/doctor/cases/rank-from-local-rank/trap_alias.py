"""The same through an alias and a plain variable read from the environment."""
import os

import torch
import torch.distributed as D

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
D.init_process_group("nccl", world_size=int(os.environ["WORLD_SIZE"]), rank=local_rank)  # expect: rank-from-local-rank
