"""Seed 004 (rentainhe/pytorch-distributed-training), "Usage 单机多卡" steps 1-5: the script
``distributed.py`` started by ``torch.distributed.launch``.

``--local_rank`` from the launcher; ``main_worker(local_rank, nprocs, args)`` with
``init_process_group(backend='nccl', init_method='tcp://ip:port', world_size=nprocs,
rank=local_rank)``, ``set_device``/``cuda(local_rank)``, DDP, ``mini_batch_size = batch_size / nprocs``
and DistributedSamplers; ``main()`` counts the GPUs and calls ``main_worker`` itself.

Started as the seed starts it (``--ip``/``--port`` name rank 0's address and a free port):
    CUDA_VISIBLE_DEVICES=0,1,2,3 python -m torch.distributed.launch --nproc_per_node=4 distributed.py
    ->  ringtrain run --gpus 0,1,2,3 --nproc_per_node=4 --master_port=PORT distributed.py --port PORT
Under ringtrain run (and torchrun, and today's torch.distributed.launch) the launcher's own store
listens on the master port and the workers join it as clients: ``--port`` must be that port.
"""

import argparse

import torch
import torch.backends.cudnn as cudnn
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import _toy

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("--local_rank", default=-1, type=int, help="node rank for distributed training")
parser.add_argument("--batch_size", "--batch-size", default=16, type=int)  # the seed: 256
parser.add_argument("--lr", default=0.5, type=float)  # the seed: 0.1
parser.add_argument("--ip", default="127.0.0.1", type=str)
parser.add_argument("--port", default=23456, type=int)
parser.add_argument("--epochs", default=6, type=int)  # the seed: 300


def main_worker(local_rank, nprocs, args):
    args.local_rank = local_rank
    # distributed initialisation, in every process
    cudnn.benchmark = True
    dist.init_process_group(backend="gloo", init_method=f"tcp://{args.ip}:{args.port}", world_size=nprocs,
                            rank=local_rank)  # CPU: gloo (the seed: nccl)
    # model, loss function, optimizer
    model = _toy.Net()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    # the GPU of this process
    device = torch.device("cpu")
    if torch.cuda.is_available():  # CPU: no GPU to pin
        torch.cuda.set_device(local_rank)
        model.cuda(local_rank)
        device = torch.device("cuda", local_rank)
    model = torch.nn.parallel.DistributedDataParallel(model)  # CPU: no device_ids (they name a GPU)

    # data, each process with a DistributedSampler
    mini_batch_size = args.batch_size // nprocs  # the seed: batch_size / nprocs, a float DataLoader refuses
    train_dataset = _toy.dataset()
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
    trainloader = DataLoader(train_dataset, batch_size=mini_batch_size, sampler=train_sampler)

    test_dataset = _toy.dataset(16)
    test_sampler = DistributedSampler(test_dataset)
    testloader = DataLoader(train_dataset, batch_size=mini_batch_size,  # noqa: F841  the seed's slip: train_dataset
                            sampler=test_sampler)

    # the usual training loop (the seed calls no train_sampler.set_epoch: each epoch repeats the order)
    losses = []
    for epoch in range(args.epochs):
        model.train()
        total = 0.0
        for batch_idx, (images, target) in enumerate(trainloader):
            images = images.to(device, non_blocking=True)  # CPU: .to(device) (the seed: .cuda(non_blocking=True))
            target = target.to(device, non_blocking=True)
            pred = model(images)
            loss = criterion(pred, target)  # the seed calls it loss_function here
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        losses.append(total / len(trainloader))
        if local_rank == 0:
            print(f"epoch {epoch} loss {losses[-1]:.4f}", flush=True)
    _toy.report(model, losses, dist.get_rank())  # test hook
    return losses


def main():
    args = parser.parse_args()
    args.nprocs = torch.cuda.device_count() or 2  # CPU: no GPUs to count; two processes
    main_worker(args.local_rank, args.nprocs, args)


if __name__ == "__main__":
    main()
