"""Horovod's recipe minus the broadcast: ranks start from different random weights."""
import horovod.torch as hvd
import torch

hvd.init()
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())  # expect: hvd-broadcast
