"""Seed 001 (Horovod on a cluster, SwAV): its four Python blocks in order, names shortened."""
import horovod.torch as hvd
import torch

hvd.init()
torch.cuda.set_device(hvd.local_rank())


def build(args, train_dataset, make_model, LARS):
    sampler = torch.utils.data.distributed.DistributedSampler(train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, sampler=sampler, batch_size=args.batch_size,
                                               num_workers=args.workers, pin_memory=True, drop_last=True)
    model = make_model(args).cuda()
    optimizer = LARS(model.parameters(), lr=args.base_lr, momentum=args.momentum, weight_decay=args.wd)  # expect: hvd-lr-scale
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         backward_passes_per_step=args.batches_per_allreduce,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return train_loader, model, optimizer
