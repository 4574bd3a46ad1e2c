"""Fixed: the optimizer is built on the wrapped model (FSDP1 kept on purpose)."""
import functools
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy


def build(local_rank):
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(local_rank)
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=100)
    model = FSDP(model, auto_wrap_policy=policy, device_id=local_rank)  # ringtrain: ignore[fsdp1-api]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, optimizer


if __name__ == "__main__":
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    model, optimizer = build(local_rank)
