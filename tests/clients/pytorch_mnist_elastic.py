"""CPU twin of Horovod's examples/elastic/pytorch/pytorch_mnist_elastic.py (v0.28.1).

The same launch contract: ``horovodrun -np 2 --min-np 1 --max-np 4 --host-discovery-script ./discover.sh
python pytorch_mnist_elastic.py``; the training loop in ``@hvd.elastic.run def train(state)`` with a
``TorchState`` committed every batch and a reset callback that rescales the learning rate. Changed: random
28x28 "digits" instead of a torchvision download, a small MLP, two epochs.
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import horovod.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
parser.add_argument("--batch-size", type=int, default=16, metavar="N")
parser.add_argument("--epochs", type=int, default=2, metavar="N")
parser.add_argument("--lr", type=float, default=0.01, metavar="LR")
parser.add_argument("--momentum", type=float, default=0.5, metavar="M")
parser.add_argument("--seed", type=int, default=42, metavar="S")
parser.add_argument("--log-interval", type=int, default=4, metavar="N")
args = parser.parse_args()

hvd.init()
torch.manual_seed(args.seed)
torch.set_num_threads(1)


def digits(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(torch.rand(n, 1, 28, 28, generator=generator),
                                          torch.randint(0, 10, (n,), generator=generator))


train_dataset = digits(128, 0)
train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset, num_replicas=hvd.size(),
                                                                rank=hvd.rank())
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x.view(-1, 784)))), dim=1)


model = Net()
optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
steps = 0


@hvd.elastic.run
def train(state):
    global steps
    for state.epoch in range(state.epoch, args.epochs + 1):
        state.model.train()
        train_sampler.set_epoch(state.epoch)
        steps_remaining = len(train_loader) - state.batch
        for state.batch, (data, target) in enumerate(train_loader):
            if state.batch >= steps_remaining:
                break
            state.optimizer.zero_grad()
            loss = F.nll_loss(state.model(data), target)
            loss.backward()
            state.optimizer.step()
            steps += 1
            if state.batch % args.log_interval == 0 and hvd.rank() == 0:
                print(f"Train Epoch: {state.epoch} batch {state.batch}\tLoss: {loss.item():.6f}")
            state.commit()
        state.batch = 0


optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Average)


def on_state_reset():
    for param_group in optimizer.param_groups:
        param_group["lr"] = args.lr * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, epoch=1, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)
total = float(sum(p.detach().sum() for p in model.parameters()))
os.write(1, f"RESULT rank={hvd.rank()} world={hvd.size()} steps={steps} epoch={state.epoch} "
            f"params={total:.6f}\n".encode())
