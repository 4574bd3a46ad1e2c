"""The same folding through names: a per-process device count, the world size from torch.distributed,
the local world size from torchrun's environment, devices built with torch.device and an f-string."""
import os

import torch
import torch.distributed as D

GPUS_PER_PROC = 2


def place(model_parts):
    world = D.get_world_size()
    first = torch.device("cuda", (GPUS_PER_PROC * D.get_rank()) % world)  # expect: ranks-share-device
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    second = f"cuda:{(local_rank * GPUS_PER_PROC + 1) % local_world_size}"  # expect: ranks-share-device
    model_parts[0].to(first)
    model_parts[1].to(second)
