"""nanoGPT's flags over a Ring: `master_process = ring.is_main` guards the evaluation and the checkpoint; a helper
called under `if ring.is_local_main:`; an early return for the other ranks."""
import os

from ringtrain import Ring

eval_interval, max_iters = 10, 100


def save_checkpoint(ring, model, optimizer, path):
    ring.save(path, model=model, optimizer=optimizer)  # expect: ring-save-on-one-rank


def export(ring, model, out_dir):
    if not ring.is_main:
        return
    ring.save(os.path.join(out_dir, "final.pt"), full=True, model=model)  # expect: ring-save-on-one-rank


def main(model, optimizer, get_batch, out_dir):
    ring = Ring(precision="bf16-mixed")
    master_process = ring.is_main
    model, optimizer = ring.setup(model, optimizer)
    for iter_num in ring.steps(max_iters):
        if iter_num % eval_interval == 0 and master_process:
            print(f"step {iter_num}")
            if iter_num > 0:
                ring.save(os.path.join(out_dir, "ckpt.pt"), model=model, optimizer=optimizer)  # expect: ring-save-on-one-rank
        X, Y = get_batch("train")
        logits, loss = model(X, Y)
        ring.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if ring.is_local_main and iter_num % 50 == 0:
            save_checkpoint(ring, model, optimizer, os.path.join(out_dir, "node.pt"))
    export(ring, model, out_dir)
