"""The state synced by hand: TorchState.sync() broadcasts rank 0's model and optimizer."""
import horovod.torch as hvd
import torch

hvd.init()
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


def train(state):
    for state.batch in range(state.batch, 10):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
        state.commit()


state = hvd.elastic.TorchState(model, optimizer, batch=0)
state.sync()
train(state)
