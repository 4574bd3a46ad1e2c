"""Which of the two save rules speaks in an FSDP2 script: a gathered full state (the same on every
rank) written everywhere is save-every-rank's warning; the shards written everywhere are
save-sharded-every-rank's error, and save-every-rank then stays quiet on that line."""
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
model = fully_shard(nn.Linear(8, 2))
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
torch.save(full, "full.pt")  # expect: save-every-rank
torch.save(model.state_dict(), "sharded.pt")  # expect: save-sharded-every-rank
