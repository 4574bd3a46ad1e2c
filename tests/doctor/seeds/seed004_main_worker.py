"""Seed 004 (a DDP study repo's README): main_worker and the launcher-style main, with the
README's placeholders (`model = ...`) given values so the file parses and runs its logic."""
import argparse

import torch
import torch.backends.cudnn as cudnn
import torch.distributed as dist

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("--local_rank", default=-1, type=int, help="node rank for distributed training")  # expect: local-rank-arg
parser.add_argument("--batch_size", "--batch-size", default=256, type=int)


def main_worker(local_rank, nprocs, args, model, criterion, optimizer, train_dataset, test_dataset, loss_function):
    args.local_rank = local_rank
    cudnn.benchmark = True
    dist.init_process_group(backend="nccl", init_method="tcp://127.0.0.1:23456", world_size=nprocs, rank=local_rank)  # expect: rank-from-local-rank
    torch.cuda.set_device(local_rank)
    model.cuda(local_rank)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])

    mini_batch_size = args.batch_size / nprocs
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
    trainloader = torch.utils.data.DataLoader(train_dataset, batch_size=mini_batch_size, sampler=train_sampler)  # expect: batch-size-float
    test_sampler = torch.utils.data.distributed.DistributedSampler(test_dataset)
    testloader = torch.utils.data.DataLoader(train_dataset, batch_size=mini_batch_size, sampler=test_sampler)  # expect: batch-size-float, sampler-dataset-mismatch

    for epoch in range(300):  # expect: sampler-set-epoch
        model.train()
        for batch_idx, (images, target) in enumerate(trainloader):
            images = images.cuda(non_blocking=True)
            target = target.cuda(non_blocking=True)
            loss = loss_function(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def main(*parts):
    args = parser.parse_args()
    args.nprocs = torch.cuda.device_count()
    main_worker(args.local_rank, args.nprocs, args, *parts)
