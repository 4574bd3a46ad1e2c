"""The sampler shuffles; the loader does not."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
dataset = TensorDataset(torch.randn(64, 4))
loader = DataLoader(dataset, batch_size=16, sampler=DistributedSampler(dataset))
