"""Fixed: every rank runs the sample forward (each joins the all-gathers); rank 0 prints it."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def main(loader, steps=100):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]).cuda()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (x, y) in enumerate(loader):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 10 == 0:
            with torch.no_grad():
                sample = model(x[:1])
            if rank == 0:
                print(step, sample.norm().item())
    dist.destroy_process_group()
