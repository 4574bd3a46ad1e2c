"""The same script with every ring.save on every rank: the evaluation's print stays on the master process, the
checkpoint step is decided by values every rank has."""
import os

from ringtrain import Ring

eval_interval, max_iters = 10, 100


def save_checkpoint(ring, model, optimizer, path):
    ring.save(path, model=model, optimizer=optimizer)


def export(ring, model, out_dir):
    ring.save(os.path.join(out_dir, "final.pt"), full=True, model=model)


def main(model, optimizer, get_batch, out_dir):
    ring = Ring(precision="bf16-mixed")
    master_process = ring.is_main
    model, optimizer = ring.setup(model, optimizer)
    for iter_num in ring.steps(max_iters):
        if iter_num % eval_interval == 0:
            if master_process:
                print(f"step {iter_num}")
            if iter_num > 0:
                ring.save(os.path.join(out_dir, "ckpt.pt"), model=model, optimizer=optimizer)
        X, Y = get_batch("train")
        logits, loss = model(X, Y)
        ring.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if iter_num % 50 == 0:
            save_checkpoint(ring, model, optimizer, os.path.join(out_dir, "node.pt"))
    export(ring, model, out_dir)
