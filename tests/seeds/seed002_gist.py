"""Seed 002's "complete PyTorch gist" for DistributedDataParallel, and its follow-up block that
logs the loss reduced to rank 0.

The gist: parse the ``--local_rank`` the launcher passes, ``init_process_group('nccl')``, a
``DistributedSampler`` in a ``DataLoader``, the model on ``cuda:local_rank`` wrapped in DDP,
then the training loop as the seed writes it (it has no ``optimizer.zero_grad()``, so
gradients add up from step to step; one process with the same global batches does the same).
The follow-up ("In continuation with distributedDataParallel.py above") calls
``get_reduced_loss`` -- a ``dist.reduce`` -- under ``if args.local_rank == 0``; it is switched
on with ``--log_reduced_loss``.

Started as the seed starts it, with ringtrain in place of the launcher:
    python -m torch.distributed.launch --nproc_per_node=4 --nnodes=1 --node_rank=0 --master_port=1234 train.py
    ->  ringtrain run --nproc_per_node=2 --nnodes=1 --node_rank=0 --master_port=1234 seed002_gist.py
"""

import argparse

import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import _toy

# parse the local_rank argument from the command line for the current process
parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", default=0, type=int)
parser.add_argument("--log_reduced_loss", action="store_true")  # not in the gist: switches on its follow-up block
args = parser.parse_args()

# the distributed backend that keeps the processes in step
torch.distributed.init_process_group("gloo")  # CPU: gloo (the seed: 'nccl')

# a DistributedSampler gives each process its share of the dataset
dataset = _toy.dataset()
dist_sampler = DistributedSampler(dataset)
dataloader = DataLoader(dataset, sampler=dist_sampler)  # the gist's batch_size: DataLoader's default, 1

# this process's device
device = torch.device("cuda", args.local_rank) if torch.cuda.is_available() else torch.device("cpu")  # CPU
model = _toy.Net()
model = model.to(device)
model = torch.nn.parallel.DistributedDataParallel(model)  # CPU: no device_ids/output_device (they name a GPU)
loss_fn = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def get_reduced_loss(loss, dest_device):
    loss_tensor = loss.clone()
    torch.distributed.reduce(loss_tensor, dst=dest_device)
    return loss_tensor


# train the model as on one device
losses = []
for inputs, labels in dataloader:
    inputs = inputs.to(device)
    labels = labels.to(device)

    preds = model(inputs)
    loss = loss_fn(preds, labels)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
    if args.log_reduced_loss and args.local_rank == 0:  # the follow-up block, as the seed writes it
        loss_tensor = get_reduced_loss(loss.detach(), 0)
        print(f"Current batch Loss = {loss_tensor.item()}")
_toy.report(model, losses, torch.distributed.get_rank())  # test hook
