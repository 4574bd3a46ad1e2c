"""Fixed: every distributed path wraps — the CPU one and other accelerators without device_ids."""
import torch
import torch.distributed as D
import torch.utils.data as tud
from torch.nn.parallel import DistributedDataParallel as Wrapped


def main_worker(gpu, args):
    use_accel = not args.no_accel and torch.accelerator.is_available()
    device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
    if args.distributed:
        D.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                             world_size=args.world_size, rank=args.rank)
    model = torch.nn.Linear(4, 2)
    if not use_accel:
        print("using CPU, this will be slow")
        if args.distributed:
            model = Wrapped(model)
    elif args.distributed:
        if device.type == "cuda":
            if gpu is not None:
                torch.cuda.set_device(gpu)
                model.cuda(device)
                model = Wrapped(model, device_ids=[gpu])
            else:
                model.cuda()
                model = Wrapped(model)
        else:
            model = Wrapped(model.to(device))
    else:
        model.to(device)

    train_dataset = tud.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    train_sampler = tud.distributed.DistributedSampler(train_dataset) if args.distributed else None
    loader = tud.DataLoader(train_dataset, batch_size=8, shuffle=(train_sampler is None), sampler=train_sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        train(loader, model, optimizer)


def train(loader, model, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
