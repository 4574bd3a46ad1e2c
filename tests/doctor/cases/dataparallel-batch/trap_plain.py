"""DataParallel: the loader's batch of 256 is split over the GPUs."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.DataParallel(nn.Linear(4, 2)).cuda()  # expect: dataparallel-batch
loader = DataLoader(TensorDataset(torch.randn(1024, 4)), batch_size=256, shuffle=True)
