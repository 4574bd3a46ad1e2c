"""The single-worker learning rate, kept as is under Horovod."""
import argparse

import horovod.torch as hvd
import torch.optim as optim
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()
hvd.init()
model = nn.Linear(4, 2)
optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)  # expect: hvd-lr-scale
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
