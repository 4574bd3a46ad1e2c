"""Draws that are not a per-rank split: a batch shuffled inside one rank's step, noise, a split
drawn on rank 0 only and broadcast, a seeded generator passed by name."""
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset, random_split

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.randn(32, 4)
x = x[torch.randperm(len(x))]  # mixes this rank's own batch: nothing to agree on
noise = torch.randperm(10) + rank

data = TensorDataset(torch.randn(100, 4))
if rank == 0:
    train_part, val_part = random_split(data, [80, 20])
    split = [train_part.indices]
else:
    split = [None]
dist.broadcast_object_list(split, src=0)

shared = torch.Generator().manual_seed(0)
a, b = random_split(data, [50, 50], generator=shared)
