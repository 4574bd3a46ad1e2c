"""Step 5: a model split into pipeline stages across processes (and pipeline x data parallel).

Launch:
    ringtrain run --nproc-per-node 2 examples/pipeline.py                  # 2 stages on 2 processes
    ringtrain run --nproc-per-node 4 examples/pipeline.py                  # 2 stages x 2 replicas on 4
    ringtrain run --nproc-per-node 2 examples/pipeline.py --schedule gpipe --microbatches 8
    torchrun --nproc-per-node 4 examples/pipeline.py                       # the same through torchrun

The diff from 02_ddp.py: a Pipeline strategy object,
``rt.Ring(strategy=rt.strategies.Pipeline(stages=2, microbatches=4, schedule="1f1b",
split_at=["7"]))`` (the split point is a module name: the model is an nn.Sequential),
``loss = ring.pipeline_step(x, y, loss_fn)`` in place of forward + ring.backward, and
evaluation from the saved checkpoint, which is the whole unsplit model. With W processes and S stages there are W/S replicas;
``ring.loader`` shards the data across replicas, and every stage of a replica
sees the same batches (stage 0 feeds x in, the last stage scores y).

On each rank ``model`` is only that rank's stage and ``optimizer`` holds only
its parameters (the other stages' tensors were freed), so each process holds
about 1/S of the model. Each batch is cut into ``microbatches`` equal parts:
the batch size must be a multiple of it (hence drop_last=True).
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import ringtrain as rt
from ringtrain.bench.datasets import digits


def make_model() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def accuracy(model: nn.Module, dataset) -> float:
    """Held-out accuracy of the whole (unsplit) model in one process."""
    x, y = dataset.tensors
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per replica; a multiple of --microbatches")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved"])
    parser.add_argument("--precision", default="32")
    parser.add_argument("--checkpoint", default="digits_pipeline.pt")
    args = parser.parse_args()

    # "7" is nn.Flatten: stage 0 = the convolutions, stage 1 = the classifier.
    # (schedule="interleaved" needs 2 chunks per rank: e.g. split_at=["3", "7", "9"].)
    split_at = ["3", "7", "9"] if args.schedule == "interleaved" else ["7"]
    pipeline = rt.strategies.Pipeline(stages=args.stages, microbatches=args.microbatches,
                                      schedule=args.schedule, split_at=split_at)
    # seed: every rank builds the same full model before keeping its stage
    ring = rt.Ring(strategy=pipeline, precision=args.precision, seed=0)
    train_set, test_set = digits()
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    model, optimizer = ring.setup(model, optimizer)  # this rank's stage, and its parameters' optimizer
    train = ring.loader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True)

    for epoch in ring.epochs(args.epochs):
        for x, y in ring.progress(train, desc=f"epoch {epoch}"):
            loss = ring.pipeline_step(x, y, F.cross_entropy)  # all micro-batches, forward and backward
            ring.clip_grad_norm_(model, 1.0)  # the norm of the whole model's gradient, over all stages
            optimizer.step()
            optimizer.zero_grad()
        ring.print(f"epoch {epoch}: loss {loss.item():.4f}")
        # One unsplit state dict, gathered from the stages: loadable by plain PyTorch.
        ring.save(args.checkpoint, model=model, optimizer=optimizer, epoch=epoch)

    if ring.is_main:
        whole = make_model()
        whole.load_state_dict(torch.load(args.checkpoint, weights_only=True)["model"])
        print(f"held-out accuracy of the unsplit model: {accuracy(whole, test_set):.4f}")
    ring.close()


if __name__ == "__main__":
    main()
