"""Seed 000 (torch.distributed.launch, pytorch 1.0 era), its two code blocks put together.

The post says to call torch.cuda.set_device(i) in its prose, but the code it shows never
does; `rank=,` is repaired to `rank=args.local_rank`, as the text then suggests.
"""
import argparse

import torch
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int)  # expect: local-rank-arg
args = parser.parse_args()
i = args.local_rank

torch.distributed.init_process_group(backend="nccl", world_size=4, rank=i, init_method="env://")  # expect: set-device
model = torch.nn.Linear(8, 8)
model = DistributedDataParallel(model.cuda(i), device_ids=[i], output_device=i)
