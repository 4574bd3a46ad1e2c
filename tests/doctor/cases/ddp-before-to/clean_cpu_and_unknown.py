"""DDP on the CPU (Gloo, no device_ids) is fine; a model from a factory we cannot see is not judged."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from mylib import build_model

dist.init_process_group("gloo")
cpu_model = DDP(torch.nn.Linear(4, 2))


def wrap(model, rank):
    return DDP(model, device_ids=[rank])  # a parameter: where it lives is the caller's business


gpu_model = DDP(build_model("resnet50"), device_ids=[0])


def branches(gpu):
    # a model on the GPU on one path, on the CPU (without device_ids) on the other
    if gpu is not None:
        model = torch.nn.Linear(4, 2).cuda(gpu)
    else:
        model = torch.nn.Linear(4, 2)
    return DDP(model, device_ids=[gpu] if gpu is not None else None)



def resumed_or_fresh(gpu, checkpoint):
    # torch.load returns a whole module where it was saved: not provably on the CPU
    model = torch.load(checkpoint, weights_only=False) if checkpoint else torch.nn.Linear(4, 2).cuda(gpu)
    return DDP(model, device_ids=[gpu])


def loaded(gpu):
    model = torch.load("whole_model.pt", weights_only=False)
    return DDP(model, device_ids=[gpu])
