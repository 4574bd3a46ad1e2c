"""Fixed: the module is converted before DDP sees it."""
import torch
from torch.nn.parallel import DistributedDataParallel

SBN = torch.nn.SyncBatchNorm


def setup(net, gpu, sync_bn=True):
    net = net.cuda(gpu)
    if sync_bn:
        net = SBN.convert_sync_batchnorm(net)
    ddp = DistributedDataParallel(net, device_ids=[gpu])
    return ddp
