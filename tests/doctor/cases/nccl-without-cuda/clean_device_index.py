"""pytorch/examples FSDP's train_utils shape: the tensors go to `.to(local_rank)`, an integer,
which is CUDA device local_rank; NCCL is right."""
import os

import torch
import torch.distributed as dist


def setup():
    dist.init_process_group("nccl")


def train(model, loader):
    local_rank = int(os.environ["LOCAL_RANK"])
    totals = torch.zeros(2).to(local_rank)
    for batch in loader:
        loss = model(batch.to(local_rank)).sum()
        loss.backward()
        totals[0] += loss.item()
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    return totals
