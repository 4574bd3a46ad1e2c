"""The same helper given the ring: its ring.backward closes the window every 512 // (32 x world size) batches,
and the optimizer steps there."""
import torch
import torch.nn.functional as F
from ringtrain import Ring as R


def train_step(ring, model, opt, batch):
    x, y = batch
    loss = F.mse_loss(model(x), y)
    ring.backward(loss)
    opt.step()
    opt.zero_grad()
    return loss.item()


def main(dataset):
    trainer_ring = R(global_batch=512, seed=0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    net, sgd = trainer_ring.setup(net, torch.optim.SGD(net.parameters(), lr=0.01))
    for epoch in trainer_ring.epochs(5):
        for batch in trainer_ring.loader(dataset, batch_size=32, shuffle=True):
            train_step(trainer_ring, net, sgd, batch)
