"""CPU twin of a 2021 ``torch.distributed.launch`` tutorial script (the ``--local_rank`` generation).

Launched as ``python -m torch.distributed.launch --nnode=1 --node_rank=0 --nproc_per_node=2 example.py``:
``--nnode`` is argparse's abbreviation of ``--nnodes``, which torch's launcher accepts. The script parses
``--local_rank`` strictly (an unexpected ``--local-rank`` would kill it) and forms its group from the
environment (``init_method='env://'``). Gloo instead of NCCL.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
args = parser.parse_args()

dist.init_process_group(backend="gloo", init_method="env://")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    x = torch.full((2, 4), float(dist.get_rank() + step))
    model(x).sum().backward()
    optimizer.step()
weights = float(model.module.weight.detach().sum())
os.write(1, f"RESULT rank={dist.get_rank()} world={dist.get_world_size()} local_rank={args.local_rank} "
            f"env_local_rank={os.environ['LOCAL_RANK']} weights={weights:.8f}\n".encode())
dist.destroy_process_group()
