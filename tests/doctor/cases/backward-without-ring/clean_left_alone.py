"""Left alone: a plain-PyTorch reference trained beside the ring with its own optimizer; a loop that accumulates
itself (k backwards in an inner loop, then one step) with a float32 Ring; the plain branch of a script that runs
with or without the Ring; and a Ring that neither accumulates nor runs float16."""
import torch
import torch.nn.functional as F

import ringtrain as rt


def compare(data, steps=8):
    ring = rt.Ring(accumulate=2)
    model, reference = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for pair in data[:steps]:
        for x, y in pair:
            ring.backward(F.cross_entropy(model(x), y))
        opt.step()
        opt.zero_grad()
        (sum(F.cross_entropy(reference(x), y) for x, y in pair) / 2).backward()
        ref_opt.step()
        ref_opt.zero_grad()


def own_accumulation(batches, k=4):
    ring = rt.Ring(accumulate=k, precision="bf16-mixed")
    model = torch.nn.Linear(4, 2)
    model, optimizer = ring.setup(model, torch.optim.AdamW(model.parameters()))
    for step in ring.steps(100):
        for micro in range(k):
            x, y = next(batches)
            (F.cross_entropy(model(x), y) / k).backward()
        optimizer.step()
        optimizer.zero_grad()


def either(batches, use_ring):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if use_ring:
        ring = rt.Ring(precision="16-mixed")
        model, opt = ring.setup(model, opt)
        for x, y in batches:
            ring.backward(F.cross_entropy(model(x), y))
            opt.step()
    else:
        scaler = torch.amp.GradScaler("cpu")
        for x, y in batches:
            scaler.scale(F.cross_entropy(model(x), y)).backward()
            scaler.step(opt)
            scaler.update()


def plain_ring(batches):
    ring = rt.Ring()
    model = torch.nn.Linear(4, 2)
    model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for x, y in batches:
        F.cross_entropy(model(x), y).backward()
        opt.step()
