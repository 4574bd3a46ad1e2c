"""An evaluation loader with a default (shuffling) DistributedSampler: order does not matter there."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
val_set = TensorDataset(torch.randn(64, 4))
val_loader = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set, drop_last=True))
model = torch.nn.Linear(4, 2)
for epoch in range(3):
    with torch.no_grad():
        total = torch.zeros(())
        for (x,) in val_loader:
            total += model(x).sum()
    dist.all_reduce(total)
