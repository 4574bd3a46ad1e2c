"""`from torch.nn.parallel import DataParallel as DP`, inside a builder."""
import torch
from torch.nn.parallel import DataParallel as DP


def build(model, gpus):
    if len(gpus) > 1:
        model = DP(model, device_ids=gpus)  # expect: dataparallel-batch
    return model.to(torch.device("cuda", gpus[0]))
