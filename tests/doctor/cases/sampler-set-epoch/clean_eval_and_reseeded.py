"""An evaluation loader with a default (shuffling) DistributedSampler: order does not matter there.
And a training sampler rebuilt every epoch with seed=epoch: its order changes anyway."""
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

# A new sampler every epoch, seeded with the epoch: a new order every epoch without set_epoch.
train_set = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    train_loader = DataLoader(train_set, batch_size=8, sampler=DistributedSampler(train_set, seed=epoch))
    for x, y in train_loader:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
