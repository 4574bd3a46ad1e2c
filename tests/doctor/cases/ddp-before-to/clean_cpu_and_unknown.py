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
