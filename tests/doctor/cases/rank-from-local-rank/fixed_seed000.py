"""Several nodes by hand: the global rank computed from the node and the local rank."""
import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local-rank", "--local_rank", type=int, default=0)
parser.add_argument("--node", type=int, default=0)
args = parser.parse_args()
torch.cuda.set_device(args.local_rank)
dist.init_process_group("nccl", init_method="env://", world_size=16, rank=args.node * 8 + args.local_rank)
