"""The wrap in a helper, called only on the GPU; torchrun's environment forms the group on any device."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def to_ddp(model, local_rank):
    torch.cuda.set_device(local_rank)
    return DistributedDataParallel(model.cuda(local_rank), device_ids=[local_rank])


def main():
    dist.init_process_group()
    local_rank = int(os.environ["LOCAL_RANK"])
    model = torch.nn.Linear(4, 2)
    if torch.cuda.is_available():  # expect: model-not-wrapped
        model = to_ddp(model, local_rank)
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    sampler = DistributedSampler(data)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=8, sampler=sampler):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
