"""Ring(global_batch=...) under another name, and the step in a helper that receives the ring's optimizer: the
helper's loss.backward() leaves the window the global batch derives closed."""
import torch
import torch.nn.functional as F
from ringtrain import Ring as R


def train_step(model, opt, batch):
    x, y = batch
    loss = F.mse_loss(model(x), y)
    loss.backward()  # expect: backward-without-ring
    opt.step()
    opt.zero_grad()
    return loss.item()


def main(dataset):
    trainer_ring = R(global_batch=512, seed=0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    net, sgd = trainer_ring.setup(net, torch.optim.SGD(net.parameters(), lr=0.01))
    for epoch in trainer_ring.epochs(5):
        for batch in trainer_ring.loader(dataset, batch_size=32, shuffle=True):
            train_step(net, sgd, batch)
