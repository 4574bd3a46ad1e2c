"""evaluate() returns the shard's accuracy; main prints it on rank 0 as the whole set's."""
import torch
from torch import distributed as D
from torch.utils.data import DataLoader as DL, DistributedSampler as DS


def evaluate(net, loader):
    net.eval()
    hits, seen = 0, 0
    with torch.no_grad():
        for images, labels in loader:
            hits += (net(images).argmax(1) == labels).sum().item()
            seen += labels.numel()
    return hits / seen


def main(net, val_data, epochs):
    D.init_process_group("gloo")
    val_loader = DL(val_data, batch_size=64, sampler=DS(val_data, shuffle=False, drop_last=True))
    for epoch in range(epochs):
        acc = evaluate(net, val_loader)
        if D.get_rank() == 0:
            print("epoch", epoch, "val acc", acc)  # expect: unreduced-metric
