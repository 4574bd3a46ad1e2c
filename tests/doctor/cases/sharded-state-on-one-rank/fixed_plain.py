"""Fixed: the state is taken on every rank (gathered to rank 0 on the CPU), written on rank 0."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
rank = dist.get_rank()
model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
for layer in model:
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
options = StateDictOptions(full_state_dict=True, cpu_offload=True)
for epoch in range(3):
    loss = F.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 2, (8,)))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    state = {"model": get_model_state_dict(model, options=options),
             "optimizer": get_optimizer_state_dict(model, optimizer, options=options)}
    if rank == 0:
        torch.save(state, "last.pt")
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
if dist.get_rank() == 0:
    torch.save(full, "final.pt")
    print(f"saved {len(model.state_dict())} tensors")  # looking at rank 0's shards is harmless
