"""nanoGPT's habit in a ringtrain script: the window is set through ring.accumulate (derived from the
world size), and a helper divides by the same count, in place and inline."""
from ringtrain import Ring as R

gradient_accumulation_steps = 40


def micro_step(ring, model, batch):
    x, y = batch
    logits, loss = model(x, y)
    loss /= gradient_accumulation_steps  # expect: loss-divided-with-ring-accumulate
    ring.backward(loss)
    return loss


def aux_step(ring, model, batch, accum_iter):
    _, loss = model(*batch)
    ring.backward(loss / accum_iter)  # expect: loss-divided-with-ring-accumulate


def train(model, optimizer, batches):
    ring = R(precision="bf16-mixed")
    ring.accumulate = gradient_accumulation_steps // ring.world_size
    model, optimizer = ring.setup(model, optimizer)
    for i, batch in enumerate(batches):
        micro_step(ring, model, batch)
        aux_step(ring, model, batch, gradient_accumulation_steps)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
