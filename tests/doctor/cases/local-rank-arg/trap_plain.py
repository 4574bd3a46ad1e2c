"""The launcher argument as the torch 1.x tutorials declare it."""
import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)  # expect: local-rank-arg
parser.add_argument("--epochs", type=int, default=10)
args = parser.parse_args()

torch.cuda.set_device(args.local_rank)
dist.init_process_group(backend="nccl", init_method="env://")
