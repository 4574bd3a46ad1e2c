"""Fixed: one seed for every rank before the draws (a per-rank seed, if any, comes after them),
and generators seeded alike."""
import random

import numpy as np
import torch
import torch.distributed as D
import torch.utils.data as tud
from torch.utils.data import random_split as rsplit

D.init_process_group("gloo")
rank, world_size = D.get_rank(), D.get_world_size()
torch.manual_seed(1234)
np.random.seed(1234)
random.seed(1234)

data = tud.TensorDataset(torch.randn(100, 4))
train_part, val_part = rsplit(data, [80, 20])
gen = torch.Generator()
gen.manual_seed(7)
parts = rsplit(data, [50, 50], generator=gen)

perm = torch.randperm(len(data)).tolist()
train_idx = perm[:80]
train_subset = tud.Subset(data, train_idx)

order = np.random.permutation(len(data))
mine = order[rank::world_size]

indices = list(range(len(data)))
random.shuffle(indices)
shard = indices[rank * 25:(rank + 1) * 25]

picked = random.sample(range(len(data)), 20)
val_subset = tud.Subset(data, picked)
head = torch.randperm(len(data))[:10].tolist()
head_subset = tud.Subset(data, head)
