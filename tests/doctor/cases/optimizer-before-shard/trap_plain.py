"""A single-GPU script made sharded: the optimizer stays where it was, right after the model."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + torch.relu(self.fc(x))


class Net(nn.Module):
    def __init__(self, dim=16, depth=4):
        super().__init__()
        self.layers = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 2)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


dist.init_process_group("gloo")
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # expect: optimizer-before-shard
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
for step in range(10):
    loss = F.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 2, (8,)))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
