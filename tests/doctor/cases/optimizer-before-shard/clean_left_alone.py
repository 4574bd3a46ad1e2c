"""Left alone: an optimizer for another model (or another submodule), one rebuilt after sharding,
the other branch of an `if`, FSDP1 with use_orig_params=True (it keeps the parameter objects), and
one loop name walking two models in turn."""
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

dist.init_process_group("gloo")
student = nn.Linear(8, 2)
teacher = nn.Linear(8, 2)
student_opt = torch.optim.SGD(student.parameters(), lr=0.1)
fully_shard(teacher)
pair = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
head_opt = torch.optim.SGD(pair[1].parameters(), lr=0.1)
fully_shard(pair[0])

model = nn.Linear(8, 2)
optimizer = torch.optim.AdamW(model.parameters())  # a throwaway, replaced below
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters())


def setup(net, sharded):
    if sharded:
        fully_shard(net)
        opt = torch.optim.AdamW(net.parameters())
    else:
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
    return opt


setup(nn.Linear(8, 2), True)

legacy = nn.Linear(8, 2)
legacy_opt = torch.optim.SGD(legacy.parameters(), lr=0.1)
legacy = FullyShardedDataParallel(legacy, use_orig_params=True)  # ringtrain: ignore[fsdp1-api]


def compare(reference):
    # one loop name for two models: each fully_shard shards the model its own loop walks
    copy_a = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    for module in copy_a:
        fully_shard(module)
    fully_shard(copy_a)
    opt_a = torch.optim.AdamW(copy_a.parameters())
    copy_b = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    for module in copy_b:
        fully_shard(module)
    fully_shard(copy_b)
    return opt_a


compare(model)
