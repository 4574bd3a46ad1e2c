"""Seed 002's SyncBatchNorm block: convert a network's BatchNorm layers, then wrap it in DDP,
so that batch statistics are taken over the whole global batch, not each GPU's share.

    network = ....  # some network with BatchNorm layers in it
    sync_bn_network = nn.SyncBatchNorm.convert_sync_batchnorm(network)
    ddp_network = nn.parallel.DistributedDataParallel(sync_bn_network, device_ids=[args.local_rank], output_device=args.local_rank)

Started with the launcher of the gist it continues:
    ringtrain run --nproc_per_node=2 seed002_syncbn.py
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import _toy
import ringtrain as rt

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", default=0, type=int)
args = parser.parse_args()
torch.distributed.init_process_group("gloo")  # CPU: gloo (the seed: 'nccl')

network = _toy.Net(batchnorm=True)
# CPU: torch's nn.SyncBatchNorm takes GPU tensors only; ringtrain's converter makes layers that
# also run on CPU/Gloo (on GPUs the seed's line works as written).
sync_bn_network = rt.convert_sync_batchnorm(network)
ddp_network = nn.parallel.DistributedDataParallel(sync_bn_network)  # CPU: no device_ids/output_device
optimizer = torch.optim.SGD(ddp_network.parameters(), lr=0.5)

dataset = _toy.dataset()
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=8, sampler=sampler)
losses = []
for epoch in range(4):
    sampler.set_epoch(epoch)
    total = 0.0
    for x, y in loader:
        loss = F.cross_entropy(ddp_network(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
    losses.append(total / len(loader))
_toy.report(ddp_network, losses, torch.distributed.get_rank())  # test hook
