"""Left alone: a DDP model built with broadcast_buffers=False (no broadcast in the forward), the module
inside the wrapper called directly, an evaluation on every rank, and a forward in both branches of a rank
check."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main(loader, val_batches, epochs=3):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    student = DDP(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)), broadcast_buffers=False)
    teacher = DDP(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)))
    optimizer = torch.optim.SGD(list(student.parameters()) + list(teacher.parameters()), lr=0.01)
    for epoch in range(epochs):
        for x in loader:
            loss = (student(x) - teacher(x)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        with torch.no_grad():
            val = sum(teacher(x).mean().item() for x in val_batches)
        if rank == 0:
            print(epoch, val)
            with torch.no_grad():
                print(student(val_batches[0]).norm().item(), teacher.module(val_batches[0]).norm().item())
    dist.destroy_process_group()


def paired(model, x):
    """Both branches of the rank check run a forward (torch's own DDP tests do this): every rank joins."""
    if dist.get_rank() == 0:
        out = model(x)
        out.sum().backward()
    else:
        out = model(x)
        (2 * out.sum()).backward()


def run_paired(x):
    paired(DDP(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))), x)
