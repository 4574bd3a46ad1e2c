"""Fixed: the full state written on rank 0; the shards written by torch.distributed.checkpoint."""
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
model = fully_shard(nn.Linear(8, 2))
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
if dist.get_rank() == 0:
    torch.save(full, "full.pt")
dcp.save(model.state_dict(), checkpoint_id="sharded")
