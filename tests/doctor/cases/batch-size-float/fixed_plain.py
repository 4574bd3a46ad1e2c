"""Fixed: integer division."""
import argparse

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=256)
args = parser.parse_args()
dist.init_process_group("gloo")
dataset = TensorDataset(torch.randn(512, 4))
mini_batch_size = args.batch_size // dist.get_world_size()
loader = DataLoader(dataset, batch_size=mini_batch_size, sampler=DistributedSampler(dataset))
