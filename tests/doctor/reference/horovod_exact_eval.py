"""A correct Horovod script: pinned GPU, scaled rate, broadcast, exact evaluation by summed counts."""
import argparse

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()

hvd.init()
torch.cuda.set_device(hvd.local_rank())
train_set = TensorDataset(torch.randn(600, 8), torch.randint(0, 3, (600,)))
test_set = TensorDataset(torch.randn(101, 8), torch.randint(0, 3, (101,)))
train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
train_loader = DataLoader(train_set, batch_size=32, sampler=train_sampler)
test_shard = Subset(test_set, range(hvd.rank(), len(test_set), hvd.size()))
test_loader = DataLoader(test_shard, batch_size=64)

model = torch.nn.Linear(8, 3).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

for epoch in range(args.epochs):
    train_sampler.set_epoch(epoch)
    model.train()
    for x, y in train_loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x.cuda()), y.cuda()).backward()
        optimizer.step()
    model.eval()
    counts = torch.zeros(2)
    with torch.no_grad():
        for x, y in test_loader:
            counts[0] += (model(x.cuda()).argmax(1).cpu() == y).sum()
            counts[1] += len(y)
    counts = hvd.allreduce(counts, op=hvd.Sum)
    if hvd.rank() == 0:
        print(f"epoch {epoch} test accuracy {counts[0] / counts[1]:.4f}")
        torch.save(model.state_dict(), "model.pt")
