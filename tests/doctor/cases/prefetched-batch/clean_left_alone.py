"""Left alone: the prefetch in a Ring script that never checkpoints (nothing resumes), a loop that draws its batch
at the top of each step (the first draw before the loop is a warm-up the loop does not train on), and an
evaluation helper drawing its own batches."""
import torch

import ringtrain as rt


def no_checkpoints(model, optimizer, get_batch):
    ring = rt.Ring()
    model, optimizer = ring.setup(model, optimizer)
    X, Y = get_batch("train")
    for step in ring.steps(100):
        logits, loss = model(X, Y)
        X, Y = get_batch("train")
        ring.backward(loss)
        optimizer.step()


def draws_first(model, optimizer, get_batch):
    ring = rt.Ring(checkpoint_dir="ckpt", save_every=10)
    model, optimizer = ring.setup(model, optimizer)
    X, Y = get_batch("train")
    model(X, Y)  # compile warm-up
    for step in ring.steps(100):
        X, Y = get_batch("train")
        logits, loss = model(X, Y)
        ring.backward(loss)
        optimizer.step()
        if step % 10 == 0:
            with torch.no_grad():
                X, Y = get_batch("val")
                print(model(X, Y)[1].item())
