"""Left alone: a divided copy of the loss that only the log sees; a division after ring.backward; a
Ring that does not accumulate (its loop divides, but by a temperature); a Ring whose window is 1 on the
path that divides (benchmarks/accumulation.py's comparison); plain PyTorch accumulation."""
import torch.nn.functional as F

import ringtrain as rt

accum_steps, temperature = 4, 0.07


def ring_loop(model, optimizer, batches):
    ring = rt.Ring(accumulate=accum_steps)
    model, optimizer = ring.setup(model, optimizer)
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        ring.backward(loss)
        per_sample = loss / accum_steps
        ring.log({"loss": per_sample})
        loss = loss / accum_steps
        print(loss.item())
        optimizer.step()
        optimizer.zero_grad()


def no_accumulation(model, optimizer, batches):
    ring = rt.Ring()
    model, optimizer = ring.setup(model, optimizer)
    for x, y in batches:
        ring.backward(F.cross_entropy(model(x) / temperature, y))
        optimizer.step()
        optimizer.zero_grad()


def maybe_accumulating(model, optimizer, batches, no_sync):
    ring = rt.Ring(accumulate=accum_steps if no_sync else 1)
    model, optimizer = ring.setup(model, optimizer)
    for i, (x, y) in enumerate(batches):
        loss = F.cross_entropy(model(x), y)
        if no_sync:
            ring.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        else:  # the tutorial loop: ring.backward divides by nothing here
            ring.backward(loss / accum_steps)
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()


def plain_torch(model, optimizer, batches):
    for i, (x, y) in enumerate(batches):
        loss = F.cross_entropy(model(x), y) / accum_steps
        loss.backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
