"""A DDP loop as the tutorials write it, with set_epoch."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=8, sampler=sampler)
model = DDP(torch.nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

for epoch in range(3):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
