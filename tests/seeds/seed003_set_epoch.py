"""Seed 003, "注意一：使用分布式需设置set_epoch": the experiment that shows why.

21 named samples, a shuffling DistributedSampler, batches of 5; each rank prints the names
it gets, three epochs running. Experiment 1 leaves ``sampler.set_epoch(epoch)`` commented
out (every epoch repeats the same order); experiment 2 calls it (``--set_epoch`` here).

Started as a DDP script (the seed's launcher for it: torch.distributed.launch):
    ringtrain run --nproc-per-node 2 seed003_set_epoch.py               # experiment 1
    ringtrain run --nproc-per-node 2 seed003_set_epoch.py --set_epoch   # experiment 2
"""

import argparse

import torch
from torch.utils.data import DataLoader, Dataset

import _toy


class RandomDataset(Dataset):
    def __init__(self):
        self.data = torch.randn(21, 1, 32, 32)
        self.name = torch.arange(1, 22)  # names from 1, hence 22 and not 21

    def __getitem__(self, idx):
        return self.name[idx], self.data[idx]

    def __len__(self):
        return len(self.data)


parser = argparse.ArgumentParser()
parser.add_argument("--set_epoch", action="store_true", help="experiment 2 (the seed comments the line out for 1)")
args = parser.parse_args()

torch.distributed.init_process_group(backend="gloo")  # CPU: gloo (the seed: 'nccl')

dataset = RandomDataset()
sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True)
dataloader = DataLoader(dataset, batch_size=5, drop_last=True, sampler=sampler)

orders = []
for epoch in range(3):
    print(f"epoch: {epoch}")
    if args.set_epoch:
        sampler.set_epoch(epoch)
    orders.append([])
    for i, data in enumerate(dataloader, 0):
        names, _ = data
        print(names)
        orders[-1] += names.tolist()
_toy.report_orders(orders, torch.distributed.get_rank())  # test hook
