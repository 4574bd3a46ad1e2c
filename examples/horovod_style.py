"""A Horovod training script, exactly as the Horovod tutorials teach it — run by ringtrain, nothing compiled.

The only import is ``horovod.torch``; ringtrain makes that name resolve to
``ringtrain.horovod`` for the processes it starts (no ``horovod`` package is installed).

Launch:
    ringtrain run --horovod -np 2 examples/horovod_style.py               # like horovodrun -np 2
    ringtrain run --horovod -np 2 -H localhost:1,127.0.0.1:1 examples/horovod_style.py   # two "nodes"
    PYTHONPATH=src/ringtrain/horovod/_alias ringtrain run --nproc-per-node 2 examples/horovod_style.py
    PYTHONPATH=src/ringtrain/horovod/_alias python examples/horovod_style.py              # one process

Options mirror Horovod's examples: --fp16-allreduce, --batches-per-allreduce (gradient
accumulation through backward_passes_per_step), --use-adasum, --gradient-predivide-factor.
The recipe: init; pin the GPU to local_rank; shard with DistributedSampler(num_replicas=
hvd.size(), rank=hvd.rank()); scale the learning rate by the number of workers; wrap the
optimizer; broadcast parameters and optimizer state from rank 0; average metrics with allreduce.
"""

from __future__ import annotations

import argparse
import math

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from ringtrain.bench.datasets import digits  # scikit-learn's real handwritten digits; nothing downloaded
from ringtrain.bench.models import DigitsCNN


def metric_average(value: float, name: str) -> float:
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per worker per step")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate for one worker")
    parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    parser.add_argument("--batches-per-allreduce", type=int, default=1,
                        help="sub-batches per step; gradients are reduced once per step")
    parser.add_argument("--use-adasum", action="store_true", help="combine updates with Adasum")
    parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(42)
    device = torch.device("cpu")
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())  # one GPU per process
        device = torch.device("cuda", hvd.local_rank())
    torch.set_num_threads(1)  # workers share the CPU

    train_set, test_set = digits()
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    # Horovod's own recipe, kept as its tutorials write it: the sampler pads the 359 test digits
    # to a multiple of the workers, so up to hvd.size()-1 of them count twice in the accuracy
    # (`ringtrain doctor` names it; ring.loader(..., exact=True) is the exact way).
    test_sampler = DistributedSampler(  # ringtrain: ignore[eval-sampler-padding]
        test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler)

    model = DigitsCNN().to(device)
    # Adasum does not need the learning rate scaled by the number of workers (Horovod's docs).
    lr_scaler = hvd.size() if not args.use_adasum else 1
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=0.9)

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression,
        backward_passes_per_step=args.batches_per_allreduce, op=hvd.Adasum if args.use_adasum else hvd.Average,
        gradient_predivide_factor=args.gradient_predivide_factor,
    )
    if hvd.rank() == 0:
        print(f"{hvd.size()} worker(s); {len(train_set)} train / {len(test_set)} test digits", flush=True)

    sub = math.ceil(args.batch_size / args.batches_per_allreduce)
    for epoch in range(args.epochs):
        model.train()
        train_sampler.set_epoch(epoch)
        for data, target in train_loader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            parts = math.ceil(len(data) / sub)
            for i in range(0, len(data), sub):
                loss = F.cross_entropy(model(data[i:i + sub]), target[i:i + sub])
                loss.div_(parts)  # gradients are summed over the sub-batches
                loss.backward()
            optimizer.step()

        model.eval()
        correct = total = 0.0
        with torch.no_grad():
            for data, target in test_loader:
                data, target = data.to(device), target.to(device)
                correct += (model(data).argmax(1) == target).sum().item()
                total += len(target)
        accuracy = metric_average(correct / total, "accuracy")
        last_loss = metric_average(loss.item() * parts, "loss")  # collectives on every rank, printing on one
        if hvd.rank() == 0:
            print(f"epoch {epoch}: loss {last_loss:.4f} test accuracy {accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
