"""Fixed: each loader reads the dataset its sampler shards."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
train_dataset = TensorDataset(torch.randn(512, 4))
test_dataset = TensorDataset(torch.randn(100, 4))
train_sampler = DistributedSampler(train_dataset)
trainloader = DataLoader(train_dataset, batch_size=32, sampler=train_sampler)
test_sampler = DistributedSampler(test_dataset)
testloader = DataLoader(test_dataset, batch_size=32, sampler=test_sampler)
