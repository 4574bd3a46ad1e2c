"""Seed 000, "torch.nn.parallel.DistributedDataParallel" and its "启动方式" (how to start it).

The seed's blocks, put together as one script: the ``--local_rank`` argument that
``python -m torch.distributed.launch`` passes, ``torch.cuda.set_device(i)``,
``torch.distributed.init_process_group(backend='nccl', world_size=4, rank=, init_method='...')``
with ``rank`` taken from ``local_rank`` (as the seed advises), and
``DistributedDataParallel(model, device_ids=[i], output_device=i)``.

Started as the seed starts it, with ``ringtrain run`` in place of ``python -m torch.distributed.launch``:
    ringtrain run --nproc_per_node=2 seed000_launch.py
and on two nodes, one line per node (the seed's "多机使用多个GPU"):
    ringtrain run --nproc_per_node=1 --nnodes=2 --node_rank=0 --master_addr=ADDR --master_port=PORT seed000_launch.py
    ringtrain run --nproc_per_node=1 --nnodes=2 --node_rank=1 --master_addr=ADDR --master_port=PORT seed000_launch.py
On two nodes local_rank is not the rank (node 1's first process is rank 1 of 2, local rank 0):
the seed's ``rank = args.local_rank`` makes both nodes claim the same ranks and wait forever,
so that line must read ``rank = int(os.environ["RANK"])`` there (the test does so).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import _toy

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
parser.add_argument("--epochs", type=int, default=6)
args = parser.parse_args()

rank = args.local_rank  # the seed: "可以直接使用这个local_rank参数作为...rank" (true on one node)
world_size = int(os.environ["WORLD_SIZE"])  # the seed hard-codes 4, its GPU count; here: the processes started
dist.init_process_group(backend="gloo", world_size=world_size, rank=rank, init_method="env://")  # CPU: gloo, not nccl
if torch.cuda.is_available():  # CPU: no GPU to pin
    torch.cuda.set_device(args.local_rank)

model = _toy.Net()
model = DistributedDataParallel(model)  # CPU: no device_ids/output_device (they name a GPU)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
dataset = _toy.dataset()
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=8, sampler=sampler)

losses = []
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    total = torch.zeros(1)
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.detach()
    dist.all_reduce(total)  # every rank's losses, for the log
    losses.append(total.item() / (len(loader) * world_size))
    if rank == 0:
        print(f"epoch {epoch} loss {losses[-1]:.4f}", flush=True)
_toy.report(model, losses, dist.get_rank())  # test hook
dist.destroy_process_group()
