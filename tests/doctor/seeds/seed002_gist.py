"""Seed 002 (a translated Medium post): the "complete gist", then the loss-reduction snippet
it says continues it (its line breaks restored)."""
import argparse

import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", default=0, type=int)  # expect: local-rank-arg
args = parser.parse_args()

torch.distributed.init_process_group("nccl")  # expect: set-device

dataset = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
dist_sampler = DistributedSampler(dataset)
dataloader = DataLoader(dataset, sampler=dist_sampler)

device = torch.device("cuda", args.local_rank)
model = torch.nn.Linear(8, 1).to(device)
model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank], output_device=args.local_rank)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

for inputs, labels in dataloader:
    loss = torch.nn.functional.mse_loss(model(inputs.to(device)), labels.to(device))
    loss.backward()
    optimizer.step()


def get_reduced_loss(loss, dest_device):
    loss_tensor = loss.clone()
    torch.distributed.reduce(loss_tensor, dst=dest_device)  # expect: collective-on-one-rank
    return loss_tensor


if args.local_rank == 0:
    loss_tensor = get_reduced_loss(loss.detach(), 0)
    print(f"Current batch Loss = {loss_tensor.item()}")
