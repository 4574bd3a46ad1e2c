"""Seed 001: a single-GPU training script migrated to Horovod, as the seed does it for SwAV.

The seed's four blocks, in its order: hvd.init() and set_device(hvd.local_rank());
a DistributedSampler over hvd.size()/hvd.rank() with a DataLoader (pin_memory, drop_last);
the model on the GPU, a LARS optimizer, optional fp16 compression, and
hvd.DistributedOptimizer(named_parameters, compression, backward_passes_per_step,
op=Adasum|Average); then broadcast_parameters and broadcast_optimizer_state from rank 0.
"The rest is the original training code": the loop below is the single-GPU loop.

Started as the seed starts it, with ringtrain in place of horovodrun (nothing compiled):
    horovodrun -np 2 -H IP1:1,IP2:1 python seed001_horovod.py
    ->  ringtrain run --horovod -np 2 -H IP1:1,IP2:1 python seed001_horovod.py
"""

import argparse

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import _toy

parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--base_lr", type=float, default=1.0)
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--wd", type=float, default=0.0)
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--fp16_allreduce", action="store_true")
parser.add_argument("--batches_per_allreduce", type=int, default=1)
parser.add_argument("--use_adasum", action="store_true")
args = parser.parse_args()

hvd.init()
if torch.cuda.is_available():  # CPU: no GPU to pin
    torch.cuda.set_device(hvd.local_rank())

train_dataset = _toy.dataset()
sampler = torch.utils.data.distributed.DistributedSampler(train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
train_loader = torch.utils.data.DataLoader(
    train_dataset,
    sampler=sampler,
    batch_size=args.batch_size,
    num_workers=args.workers,
    pin_memory=torch.cuda.is_available(),  # CPU: nothing to pin for (the seed: True)
    drop_last=True,
)

model = _toy.Net()  # the seed builds SwAV's ResNet (resnet_models.__dict__[args.arch](...)); any model does
if torch.cuda.is_available():  # CPU: the model stays where it is (the seed: model.cuda())
    model = model.cuda()
optimizer = _toy.LARS(model.parameters(), lr=args.base_lr, momentum=args.momentum, weight_decay=args.wd)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(
    optimizer, named_parameters=model.named_parameters(),
    compression=compression,
    backward_passes_per_step=args.batches_per_allreduce,
    op=hvd.Adasum if args.use_adasum else hvd.Average)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

# The original loop. The seed's recipe has no sampler.set_epoch(epoch): every epoch draws
# the same order (ringtrain's loaders set it themselves).
k = args.batches_per_allreduce
losses = []
for epoch in range(args.epochs):
    total = 0.0
    optimizer.zero_grad()
    for i, (images, target) in enumerate(train_loader):
        loss = F.cross_entropy(model(images), target)
        (loss / k).backward()
        if (i + 1) % k == 0:  # the gradients are averaged across workers every k backward passes
            optimizer.step()
            optimizer.zero_grad()
        total += loss.item()
    # "只需要针对相应的位置做all reduce": the epoch's loss averaged over the workers
    losses.append(hvd.allreduce(torch.tensor(total / len(train_loader)), name="loss").item())
    if hvd.rank() == 0:
        print(f"epoch {epoch} loss {losses[-1]:.4f} ({hvd.size()} workers)", flush=True)
_toy.report(model, losses, hvd.rank())  # test hook
