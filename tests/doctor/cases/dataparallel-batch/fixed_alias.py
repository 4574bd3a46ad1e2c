"""Kept on purpose (a quick prototype on one machine), and said so with an ignore comment."""
import torch
from torch.nn.parallel import DataParallel as DP


def build(model, gpus):
    if len(gpus) > 1:
        # the batch size given to the loader is the global one here, by design
        model = DP(model, device_ids=gpus)  # ringtrain: ignore[dataparallel-batch]
    return model.to(torch.device("cuda", gpus[0]))
