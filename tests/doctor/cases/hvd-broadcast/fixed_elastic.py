"""Fixed: @hvd.elastic.run syncs the state (a broadcast from rank 0) before training and after
every reset (Horovod's pytorch_synthetic_benchmark_elastic.py)."""
import horovod.torch as hvd
import torch

hvd.init()
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


@hvd.elastic.run
def train(state):
    for state.batch in range(state.batch, 10):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
        state.commit()


state = hvd.elastic.TorchState(model, optimizer, batch=0)
train(state)
