"""NCCL copied from a GPU tutorial into a CPU script."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(backend="nccl")  # expect: nccl-without-cuda
model = DDP(torch.nn.Linear(4, 2))
