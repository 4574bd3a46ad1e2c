"""FSDP2 with a DDP habit: the checkpoint is taken and written under `if rank == 0:`."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
rank = dist.get_rank()
model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
for layer in model:
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for epoch in range(3):
    loss = F.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 2, (8,)))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "last.pt")  # expect: sharded-state-on-one-rank
if dist.get_rank() == 0:
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))  # expect: sharded-state-on-one-rank
    torch.save(full, "final.pt")
