"""ringtrain's Horovod face under its own name, the optimizer wrapped in a function."""
import torch

import ringtrain.horovod as hvd


def make_optimizer(model, base_lr):
    opt = torch.optim.Adam(model.parameters(), lr=base_lr * hvd.size())
    return hvd.DistributedOptimizer(  # expect: hvd-broadcast
        opt,
        named_parameters=model.named_parameters(),
    )


def main():
    hvd.init()
    model = torch.nn.Linear(4, 2)
    return make_optimizer(model, 1e-3)
