"""Aliased imports; the loader is built in a helper and iterated in another, once per epoch."""
import torch
import torch.distributed as D
from torch import nn
from torch.utils.data import DataLoader as DL, DistributedSampler as DS, TensorDataset


def make_loader(dataset, batch_size):
    return DL(dataset, batch_size=batch_size, sampler=DS(dataset, shuffle=True))


def train_one_epoch(model, loader, optimizer):
    for step, (x, y) in enumerate(loader):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main():
    D.init_process_group(backend="gloo")
    dataset = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    train_loader = make_loader(dataset, 8)
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    optimizer = torch.optim.Adam(model.parameters())
    for epoch in range(10):  # expect: sampler-set-epoch
        train_one_epoch(model, train_loader, optimizer)


if __name__ == "__main__":
    main()
