"""Fixed: each model is on its GPU before the wrap."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


class Trainer:
    def __init__(self, gpu):
        self.gpu = gpu
        self.model = Net().to(gpu)
        self.model = nn.parallel.DistributedDataParallel(self.model, device_ids=[gpu])
        self.teacher = nn.parallel.DistributedDataParallel(Net().cuda(gpu), device_ids=[gpu])
