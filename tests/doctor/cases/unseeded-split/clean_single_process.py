"""One process: random_split without a seed changes between runs, but there are no ranks to disagree."""
import torch
from torch.utils.data import DataLoader, TensorDataset, random_split

dataset = TensorDataset(torch.randn(100, 4), torch.randint(0, 2, (100,)))
train_set, val_set = random_split(dataset, [80, 20])
loader = DataLoader(train_set, batch_size=10, shuffle=True)
