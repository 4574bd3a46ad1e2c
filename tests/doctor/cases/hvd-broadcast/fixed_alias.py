"""Fixed: an identical seed on every rank builds identical weights (no broadcast needed)."""
import torch

import ringtrain.horovod as hvd


def make_optimizer(model, base_lr):
    opt = torch.optim.Adam(model.parameters(), lr=base_lr * hvd.size())
    return hvd.DistributedOptimizer(
        opt,
        named_parameters=model.named_parameters(),
    )


def main(seed=42):
    hvd.init()
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    return make_optimizer(model, 1e-3)
