"""`from horovod import torch as hvd`, the optimizer built inline, Adasum only sometimes."""
import torch
from horovod import torch as hvd


def setup(model, use_adasum):
    hvd.init()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    world = hvd.size()
    print(f"{world} workers")
    return hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=3e-4),  # expect: hvd-lr-scale
                                    op=hvd.Adasum if use_adasum else hvd.Average)
