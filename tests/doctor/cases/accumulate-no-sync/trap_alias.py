"""AMP, a `continue` between boundaries, DDP through an aliased module, backward in a helper."""
import torch
from torch import distributed as dist

P = torch.nn.parallel


def micro_step(net, scaler, batch, k):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = net(batch).pow(2).mean() / k
    scaler.scale(loss).backward()  # expect: accumulate-no-sync


def train(loader, k=8):
    dist.init_process_group("gloo")
    net = P.DistributedDataParallel(torch.nn.Linear(4, 4))
    opt = torch.optim.AdamW(net.parameters())
    scaler = torch.amp.GradScaler(enabled=False)
    for step, batch in enumerate(loader):
        micro_step(net, scaler, batch, k)
        if step % k != k - 1:
            continue
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
