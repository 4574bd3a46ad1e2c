"""Seed 000's advice: the local rank given as the global rank, parsed from --local-rank."""
import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local-rank", "--local_rank", type=int, default=0)
args = parser.parse_args()
dist.init_process_group(backend="nccl", init_method="env://", world_size=8, rank=args.local_rank)  # expect: rank-from-local-rank
torch.cuda.set_device(args.local_rank)
