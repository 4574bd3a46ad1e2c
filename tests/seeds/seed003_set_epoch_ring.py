"""Seed 003's set_epoch experiment with a ring loader: no sampler and no set_epoch to forget.
A ring loader reshuffles on every pass, even in a plain ``for epoch in range(3)`` loop
(``ring.epochs`` also sets the epoch, and resumes after a checkpoint).

    ringtrain run --nproc-per-node 2 seed003_set_epoch_ring.py
"""

import torch
from torch.utils.data import Dataset

import _toy
import ringtrain as rt


class RandomDataset(Dataset):  # the seed's
    def __init__(self):
        self.data = torch.randn(21, 1, 32, 32)
        self.name = torch.arange(1, 22)

    def __getitem__(self, idx):
        return self.name[idx], self.data[idx]

    def __len__(self):
        return len(self.data)


ring = rt.Ring()
dataloader = ring.loader(RandomDataset(), batch_size=5, shuffle=True, drop_last=True)
orders = []
for epoch in range(3):
    ring.print(f"epoch: {epoch}")
    orders.append([])
    for names, _ in dataloader:
        orders[-1] += names.tolist()
    print(f"rank {ring.rank}: {orders[-1]}")
_toy.report_orders(orders, ring.rank)  # test hook
