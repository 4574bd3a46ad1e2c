"""Seed 003's experiment: 21 numbered samples, a shuffling DistributedSampler, three epochs
without set_epoch (the post shows every epoch printing the same order)."""
import torch
from torch.utils.data import DataLoader, Dataset


class RandomDataset(Dataset):
    def __init__(self):
        self.data = torch.randn(21, 1, 32, 32)
        self.name = torch.arange(1, 22)

    def __getitem__(self, idx):
        return self.name[idx], self.data[idx]

    def __len__(self):
        return len(self.data)


torch.distributed.init_process_group(backend="nccl")
dataset = RandomDataset()
sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True)
dataloader = DataLoader(dataset, batch_size=5, drop_last=True, sampler=sampler)

for epoch in range(3):  # expect: sampler-set-epoch
    print(f"epoch: {epoch}")
    for i, data in enumerate(dataloader, 0):
        names, _ = data
        print(names)
