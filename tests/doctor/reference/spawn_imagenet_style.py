"""A correct mp.spawn script with a DataParallel fallback, in the shape of the ImageNet example."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.utils.data
import torch.utils.data.distributed
import torchvision

parser = argparse.ArgumentParser()
parser.add_argument("--world-size", default=1, type=int)
parser.add_argument("--rank", default=0, type=int)
parser.add_argument("--dist-url", default="env://")
parser.add_argument("--dist-backend", default="nccl")
parser.add_argument("--batch-size", default=256, type=int)
parser.add_argument("--epochs", default=90, type=int)
parser.add_argument("--resume", default="")
parser.add_argument("--gpu", default=None, type=int)
parser.add_argument("--multiprocessing-distributed", action="store_true")


class AverageMeter:
    def __init__(self):
        self.sum, self.count = 0.0, 0

    def update(self, value, n):
        self.sum += value * n
        self.count += n

    def all_reduce(self):
        total = torch.tensor([self.sum, self.count], dtype=torch.float32, device="cuda")
        dist.all_reduce(total, dist.ReduceOp.SUM)
        self.sum, self.count = total.tolist()

    @property
    def avg(self):
        return self.sum / max(self.count, 1)


def main():
    args = parser.parse_args()
    args.distributed = args.world_size > 1 or args.multiprocessing_distributed
    ngpus_per_node = torch.cuda.device_count()
    if args.multiprocessing_distributed:
        args.world_size = ngpus_per_node * args.world_size
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
    else:
        main_worker(args.gpu, ngpus_per_node, args)


def main_worker(gpu, ngpus_per_node, args):
    args.gpu = gpu
    if args.distributed:
        if args.multiprocessing_distributed:
            args.rank = args.rank * ngpus_per_node + gpu
        dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                                world_size=args.world_size, rank=args.rank)
    model = torchvision.models.resnet18()
    if args.distributed and args.gpu is not None:
        torch.cuda.set_device(args.gpu)
        model.cuda(args.gpu)
        args.batch_size = int(args.batch_size / ngpus_per_node)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    elif args.distributed:
        model.cuda()
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        model = torch.nn.DataParallel(model).cuda()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
    start_epoch = 0
    if args.resume and os.path.isfile(args.resume):
        if args.gpu is None:
            checkpoint = torch.load(args.resume)
        else:
            checkpoint = torch.load(args.resume, map_location=f"cuda:{args.gpu}")
        start_epoch = checkpoint["epoch"]
        model.load_state_dict(checkpoint["state_dict"])
    train_dataset = torchvision.datasets.FakeData(1000, transform=torchvision.transforms.ToTensor())
    val_dataset = torchvision.datasets.FakeData(200, transform=torchvision.transforms.ToTensor())
    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
        val_sampler = torch.utils.data.distributed.DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    else:
        train_sampler = None
        val_sampler = None
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                               shuffle=(train_sampler is None), sampler=train_sampler)
    val_loader = torch.utils.data.DataLoader(val_dataset, batch_size=args.batch_size, shuffle=False,
                                             sampler=val_sampler)
    criterion = nn.CrossEntropyLoss().cuda(args.gpu)
    for epoch in range(start_epoch, args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        train(train_loader, model, criterion, optimizer, args)
        acc1 = validate(val_loader, model, args)
        if not args.multiprocessing_distributed or args.rank % ngpus_per_node == 0:
            save_checkpoint({"epoch": epoch + 1, "state_dict": model.state_dict(), "acc1": acc1})


def train(train_loader, model, criterion, optimizer, args):
    model.train()
    for images, target in train_loader:
        images, target = images.cuda(args.gpu, non_blocking=True), target.cuda(args.gpu, non_blocking=True)
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def validate(val_loader, model, args):
    top1 = AverageMeter()
    model.eval()
    with torch.no_grad():
        for images, target in val_loader:
            images, target = images.cuda(args.gpu), target.cuda(args.gpu)
            top1.update((model(images).argmax(1) == target).float().mean().item(), images.size(0))
    if args.distributed:
        top1.all_reduce()
    print(f" * Acc@1 {top1.avg:.3f}")
    return top1.avg


def save_checkpoint(state, filename="checkpoint.pth.tar"):
    torch.save(state, filename)


if __name__ == "__main__":
    main()
