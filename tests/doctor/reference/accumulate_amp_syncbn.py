"""A correct DDP script with accumulation (no_sync), AMP, SyncBatchNorm before the wrap, the
rank-0-first download idiom and a rank-0 checkpoint."""
import contextlib
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

ACCUMULATE = 4


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    if local_rank != 0:
        dist.barrier()  # let the first process of the node download
    data = TensorDataset(torch.randn(1024, 3, 8, 8), torch.randint(0, 10, (1024,)))
    if local_rank == 0:
        dist.barrier()
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10))
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model).cuda(local_rank)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler, drop_last=True)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            boundary = (i + 1) % ACCUMULATE == 0
            with contextlib.nullcontext() if boundary else model.no_sync():
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda()) / ACCUMULATE
                scaler.scale(loss).backward()
            if boundary:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
        stats = torch.tensor([loss.item()], device="cuda")
        dist.all_reduce(stats)
        if dist.get_rank() == 0:
            print(f"epoch {epoch} loss {stats.item() / dist.get_world_size():.4f}")
            torch.save({"model": model.module.state_dict(), "epoch": epoch}, "ckpt.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
