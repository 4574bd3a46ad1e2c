"""The arms without a wrap are single-process runs, or leave: nothing to report."""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def build(args, model):
    if args.local_rank != -1:
        torch.cuda.set_device(args.local_rank)
        dist.init_process_group("nccl")
        model = DDP(model.cuda(), device_ids=[args.local_rank])
    elif torch.cuda.device_count() > 1:  # one process, several GPUs
        model = model.cuda()
    return model


def build_world(world_size, model):
    if world_size > 1:
        if torch.cuda.is_available():
            model = DDP(model.cuda())
        else:
            model = DDP(model)
    return model


def gpu_only(model, local_rank):
    if torch.cuda.is_available():
        model = DDP(model.cuda(local_rank), device_ids=[local_rank])
    else:
        sys.exit("this script needs GPUs")
    return model


def main(args):
    model = build(args, torch.nn.Linear(4, 2))
    model = build_world(int(os.environ.get("WORLD_SIZE", 1)), model)
    model = gpu_only(model, args.local_rank)
    dataset = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
