"""Fixed: Gloo reduces CPU tensors."""
import torch
from torch import distributed as D

BACKEND = "gloo"


def run():
    D.init_process_group(backend=BACKEND, init_method="env://")
    t = torch.ones(3)
    D.all_reduce(t)
    return t
