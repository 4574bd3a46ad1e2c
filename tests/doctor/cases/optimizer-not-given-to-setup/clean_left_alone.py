"""Left alone: DDP (setup keeps the parameter objects), the optimizer built after setup on the model it returns,
an optimizer rebuilt after setup under the same name, and one never stepped."""
import torch

import ringtrain as rt


def ddp(batches):
    ring = rt.Ring(strategy="ddp")
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model = ring.setup(model)
    for x, y in batches:
        ring.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()


def after(batches):
    ring = rt.Ring(strategy="fsdp")
    model = ring.setup(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        ring.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()


def rebuilt(batches):
    ring = rt.Ring(strategy="fsdp")
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model = ring.setup(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        ring.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()


def never_stepped():
    ring = rt.Ring(strategy="fsdp")
    model = torch.nn.Linear(4, 2)
    probe = torch.optim.SGD(model.parameters(), lr=0.1)
    model = ring.setup(model)
    return model, probe.defaults
