"""Moved first, then wrapped."""
import os

import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
model = torchvision.models.resnet18(num_classes=10)
model.cuda(local_rank)
model = DDP(model, device_ids=[local_rank])

backbone = torchvision.models.resnet50().cuda()
backbone = torch.nn.SyncBatchNorm.convert_sync_batchnorm(backbone)
backbone = DDP(backbone, device_ids=[local_rank])
