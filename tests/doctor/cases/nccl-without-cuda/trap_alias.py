"""The backend in a variable, a collective on a CPU tensor."""
import torch
from torch import distributed as D

BACKEND = "nccl"


def run():
    D.init_process_group(backend=BACKEND, init_method="env://")  # expect: nccl-without-cuda
    t = torch.ones(3)
    D.all_reduce(t)
    return t
