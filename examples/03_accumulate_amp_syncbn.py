"""Step 3: gradient accumulation, mixed precision, SyncBatchNorm, a scheduler, clipping.

Launch:
    python examples/03_accumulate_amp_syncbn.py
    ringtrain run --nproc-per-node 2 examples/03_accumulate_amp_syncbn.py --precision bf16-mixed

The diff from 02_ddp.py is the Ring's arguments, the scheduler through setup,
and one clip line. With accumulate=4 the optimizer, the scheduler and DDP's
all-reduce act once per 4 micro-batches; the global batch is printed at start.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import ringtrain as rt
from ringtrain.bench.datasets import digits


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def accuracy(ring, model, loader) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
    model.train()
    return ring.all_reduce(correct, op="sum").item() / ring.all_reduce(total, op="sum").item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8, help="per process per micro-batch")
    parser.add_argument("--accumulate", type=int, default=4)
    parser.add_argument("--precision", default="bf16-mixed", choices=["32", "bf16-mixed", "16-mixed"])
    args = parser.parse_args()

    ring = rt.Ring(seed=0, accumulate=args.accumulate, precision=args.precision, sync_batchnorm=True)
    train_set, test_set = digits()
    model = make_model()
    lr = rt.scale_lr(1e-3, base_batch=32, global_batch=args.batch_size * ring.world_size * args.accumulate, rule="sqrt")
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=1000)
    model, optimizer, scheduler = ring.setup(model, optimizer, scheduler)
    train = ring.loader(train_set, batch_size=args.batch_size, shuffle=True)
    test = ring.loader(test_set, batch_size=256, exact=True)

    for epoch in ring.epochs(args.epochs):
        for x, y in ring.progress(train, desc=f"epoch {epoch}"):
            loss = F.cross_entropy(model(x), y)
            ring.backward(loss)
            ring.clip_grad_norm_(model, max_norm=1.0)
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            if ring.sync_now and ring.optimizer_steps % 10 == 0:  # once per optimizer step, not per micro-batch
                ring.log({"loss": loss, "lr": scheduler.get_last_lr()[0]})
        logged = ring.log({"held_out_accuracy": accuracy(ring, model, test)})
        ring.print(f"epoch {epoch}: {ring.optimizer_steps} steps, held-out accuracy {logged['held_out_accuracy']:.4f}")
    ring.save("digits_amp.pt", model=model, optimizer=optimizer, scheduler=scheduler, epoch=epoch)


if __name__ == "__main__":
    main()
