"""Inside a class, through nn.parallel.DistributedDataParallel; and a model built inline."""
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
        self.model = Net()
        self.model = nn.parallel.DistributedDataParallel(self.model, device_ids=[gpu])  # expect: ddp-before-to
        self.teacher = nn.parallel.DistributedDataParallel(Net(), device_ids=[gpu])  # expect: ddp-before-to
