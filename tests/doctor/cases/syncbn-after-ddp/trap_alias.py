"""An alias for SyncBatchNorm, the DDP object under another name, its .module converted."""
import torch
from torch.nn.parallel import DistributedDataParallel

SBN = torch.nn.SyncBatchNorm


def setup(net, gpu, sync_bn=True):
    net = net.cuda(gpu)
    ddp = DistributedDataParallel(net, device_ids=[gpu])
    if sync_bn:
        ddp.module = SBN.convert_sync_batchnorm(ddp.module)  # expect: syncbn-after-ddp
    return ddp
