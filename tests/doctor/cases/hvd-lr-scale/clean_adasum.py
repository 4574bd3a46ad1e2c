"""Adasum combines updates without a scaled learning rate (Horovod's docs)."""
import torch
import horovod.torch as hvd

hvd.init()
model = torch.nn.Linear(4, 2)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum)
