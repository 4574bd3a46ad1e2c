"""Fixed: scaled through a name that holds hvd.size() (Horovod's own example does this)."""
import torch
from horovod import torch as hvd


def setup(model, use_adasum):
    hvd.init()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    lr_scaler = hvd.size() if not use_adasum else 1
    return hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=3e-4 * lr_scaler),
                                    op=hvd.Adasum if use_adasum else hvd.Average)
