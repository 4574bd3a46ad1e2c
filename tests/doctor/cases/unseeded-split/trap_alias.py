"""Aliases, a seed that differs per rank, a per-rank generator, and index permutations that pick
each rank's samples: torch.randperm into Subset, np.random.permutation and random.shuffle sliced by rank."""
import random

import numpy as np
import torch
import torch.distributed as D
import torch.utils.data as tud
from torch.utils.data import random_split as rsplit

D.init_process_group("gloo")
rank, world_size = D.get_rank(), D.get_world_size()
torch.manual_seed(1234 + rank)  # different weights' noise per rank on purpose: not a shared seed
np.random.seed(rank)
random.seed(rank)

data = tud.TensorDataset(torch.randn(100, 4))
train_part, val_part = rsplit(data, [80, 20])  # expect: unseeded-split
gen = torch.Generator()
gen.manual_seed(rank)
parts = rsplit(data, [50, 50], generator=gen)  # expect: unseeded-split

perm = torch.randperm(len(data)).tolist()  # expect: unseeded-split
train_idx = perm[:80]
train_subset = tud.Subset(data, train_idx)

order = np.random.permutation(len(data))  # expect: unseeded-split
mine = order[rank::world_size]

indices = list(range(len(data)))
random.shuffle(indices)  # expect: unseeded-split
shard = indices[rank * 25:(rank + 1) * 25]

picked = random.sample(range(len(data)), 20)  # expect: unseeded-split
val_subset = tud.Subset(data, picked)
head = torch.randperm(len(data))[:10].tolist()  # expect: unseeded-split
head_subset = tud.Subset(data, head)
