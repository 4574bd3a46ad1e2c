"""Fixed: Gloo for CPU training."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(backend="gloo")
model = DDP(torch.nn.Linear(4, 2))
