"""CPU twin of Horovod's examples/pytorch/pytorch_mnist.py (v0.28.1), on random 28x28 "digits".

The same launch contracts: ``horovodrun --gloo -np 2 python pytorch_mnist.py`` (every process runs
``main``), and ``python pytorch_mnist.py --num-proc 2`` (``horovod.run(main, args=(args,), np=2, hosts=...,
use_gloo=..., use_mpi=...)`` starts the processes and returns each rank's result). ``import horovod`` and
``import horovod.torch as hvd`` as written. Changed: no torchvision download (a tiny random data set), a small
MLP, one epoch by default; ``main`` returns the test accuracy and the parameters' sum.
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import horovod
import horovod.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
parser.add_argument("--batch-size", type=int, default=16, metavar="N")
parser.add_argument("--epochs", type=int, default=1, metavar="N")
parser.add_argument("--lr", type=float, default=0.01, metavar="LR")
parser.add_argument("--momentum", type=float, default=0.5, metavar="M")
parser.add_argument("--seed", type=int, default=42, metavar="S")
parser.add_argument("--fp16-allreduce", action="store_true", default=False)
parser.add_argument("--num-proc", type=int)
parser.add_argument("--hosts", help="hosts to run on in notation: hostname:slots[,host2:slots[,...]]")
parser.add_argument("--communication", help="collaborative communication to use: gloo, mpi")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x.view(-1, 784)))), dim=1)


def digits(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(torch.rand(n, 1, 28, 28, generator=generator),
                                          torch.randint(0, 10, (n,), generator=generator))


def main(args):
    def metric_average(val, name):
        return hvd.allreduce(torch.tensor(val), name=name).item()

    def train(epoch):
        model.train()
        train_sampler.set_epoch(epoch)
        for data, target in train_loader:
            optimizer.zero_grad()
            F.nll_loss(model(data), target).backward()
            optimizer.step()

    def test():
        model.eval()
        accuracy = 0.0
        for data, target in test_loader:
            accuracy += model(data).argmax(1).eq(target).float().sum().item()
        return metric_average(accuracy / len(test_sampler), "avg_accuracy")

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train_dataset, test_dataset = digits(128, 0), digits(64, 1)
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset, num_replicas=hvd.size(),
                                                                    rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = torch.utils.data.distributed.DistributedSampler(test_dataset, num_replicas=hvd.size(),
                                                                   rank=hvd.rank())
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=64, sampler=test_sampler)
    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)
    for epoch in range(1, args.epochs + 1):
        train(epoch)
    accuracy = test()
    total = float(sum(p.detach().sum() for p in model.parameters()))
    os.write(1, f"RESULT rank={hvd.rank()} world={hvd.size()} accuracy={accuracy:.4f} params={total:.6f}\n".encode())
    return hvd.rank(), hvd.size(), total


if __name__ == "__main__":
    args = parser.parse_args()
    if args.num_proc:
        # run training through horovod.run
        print("Running training through horovod.run")
        results = horovod.run(main, args=(args,), np=args.num_proc, hosts=args.hosts,
                              use_gloo=args.communication == "gloo", use_mpi=args.communication == "mpi")
        print(f"RETURNED {results!r}", flush=True)
    else:
        # this is running via horovodrun
        main(args)
