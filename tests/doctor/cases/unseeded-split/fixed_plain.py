"""Fixed: the split drawn from a generator seeded alike on every rank."""
import os

import torch
from torch.distributed import init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, random_split
from torch.utils.data.distributed import DistributedSampler


def get_train_objs():
    dataset = TensorDataset(torch.randn(1000, 8), torch.randint(0, 2, (1000,)))
    train_len = int(len(dataset) * 0.9)
    train_set, test_set = random_split(dataset, [train_len, len(dataset) - train_len],
                                       generator=torch.Generator().manual_seed(42))
    return torch.nn.Linear(8, 2), train_set, test_set


def main():
    init_process_group(backend="gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    model, train_set, test_set = get_train_objs()
    model = DDP(model)
    loader = DataLoader(train_set, batch_size=32, sampler=DistributedSampler(train_set))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    print(local_rank, len(test_set))
