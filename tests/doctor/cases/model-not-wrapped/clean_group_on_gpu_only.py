"""The group forms, and the data is sharded, only where the model is wrapped: a CPU run is one
process that trains on all the data."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

model = torch.nn.Linear(4, 2)
dataset = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
if torch.cuda.is_available():
    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    model = DDP(model.cuda())
    loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset, shuffle=False))
else:
    loader = DataLoader(dataset, batch_size=8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
