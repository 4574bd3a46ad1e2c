"""Left alone. (1) nanoGPT's loop without an exit between the evaluation and the training step: rank 0's
no_grad evaluation broadcasts DDP's buffers once, matched by the other ranks' next training forward, and
rank 0's own next forward then skips its broadcast — measured with torch 2.13 and Gloo, it runs.
(2) The test after training follows a validation on every rank under no_grad, which leaves DDP with
nothing to broadcast in rank 0's next forward."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

eval_interval, max_iters = 10, 100


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))

    def forward(self, x, y):
        return nn.functional.mse_loss(self.body(x), y)


def batch():
    return torch.randn(16, 8), torch.randn(16, 1)


dist.init_process_group("gloo")
master_process = int(os.environ["RANK"]) == 0
model = DDP(Net())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = [model(*batch()).item() for _ in range(4)]
    model.train()
    return sum(losses) / len(losses)


@torch.no_grad()
def validate():
    model.eval()
    loss = torch.tensor(model(*batch()).item())
    dist.all_reduce(loss)
    model.train()
    return loss.item() / dist.get_world_size()


iter_num = 0
while True:
    if iter_num % eval_interval == 0 and master_process:
        print(f"step {iter_num}: val loss {estimate_loss():.4f}")
    loss = model(*batch())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    iter_num += 1
    if iter_num > max_iters:
        break
print(f"validation loss {validate():.4f}")
if master_process:
    print(f"test loss {estimate_loss():.4f}")
dist.destroy_process_group()
