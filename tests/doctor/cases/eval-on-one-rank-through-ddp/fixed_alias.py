"""Fixed: rank 0 validates through the module inside the wrapper (self.model.module), which runs no
collective; the other ranks go on at once."""
import torch
import torch.distributed as D
import torch.nn as nn

P = torch.nn.parallel


class Trainer:
    def __init__(self, net, train_loader, val_loader, local_rank):
        self.model = P.DistributedDataParallel(net.to(local_rank), device_ids=[local_rank])
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.train_loader, self.val_loader = train_loader, val_loader

    def _validate(self):
        self.model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in self.val_loader:
                correct += (self.model.module(x).argmax(1) == y).sum().item()
        self.model.train()
        return correct

    def fit(self, epochs):
        for epoch in range(epochs):
            self.train_loader.sampler.set_epoch(epoch)
            for x, y in self.train_loader:
                loss = nn.functional.cross_entropy(self.model(x), y)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
            if D.get_rank() == 0:
                print(f"epoch {epoch}: {self._validate()} correct")


def main(train_loader, val_loader, local_rank):
    D.init_process_group("nccl")
    torch.cuda.set_device(local_rank)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10))
    Trainer(net, train_loader, val_loader, local_rank).fit(10)
    D.destroy_process_group()
