"""One `if` per backend, each wrapping (torch's own distributed tests have this shape): the path
that skips the first `if` is the one the second covers."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

BACKEND = dist.get_backend() if dist.is_initialized() else "gloo"


def train(rank):
    dist.init_process_group(BACKEND)
    model = torch.nn.Linear(4, 2)
    if BACKEND == "gloo":
        model = DDP(model)
    if BACKEND == "nccl":
        torch.cuda.set_device(rank)
        model = DDP(model.cuda(rank), device_ids=[rank])
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False)):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
