"""Both spellings, defaulting to the variable torchrun sets."""
import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local-rank", "--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
parser.add_argument("--epochs", type=int, default=10)
args = parser.parse_args()

torch.cuda.set_device(args.local_rank)
dist.init_process_group(backend="nccl", init_method="env://")
