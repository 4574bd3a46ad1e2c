"""A small job for a cluster: one script, unchanged, under every scheduler (synthetic data, no downloads).

Launch (from the repository's root; the scripts beside this one are what tests/cluster/ submits):
    python examples/cluster/train.py --out runs/cluster                        # one process
    srun -N1 -n2 python examples/cluster/train.py --out runs/cluster           # Slurm: one process per task
    sbatch examples/cluster/one_node.sbatch --out runs/cluster                 # the same, as a batch job
    sbatch examples/cluster/two_nodes.sbatch --out runs/cluster                # one `ringtrain run` agent per node
    srun -N1 -n1 ringtrain run --nproc-per-node 2 examples/cluster/train.py    # one agent, its own workers
    mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 python examples/cluster/train.py   # Open MPI
    kubectl apply -f examples/cluster/pytorchjob.yaml                          # Kubeflow (torchrun's PET_*)

``rt.Ring()`` reads who it is from the launcher (docs/cluster.md). ``--global-batch`` is the samples per
optimizer step over all processes: the job trains the same parameters on any number of them (one process
accumulates). ``--checkpoint-dir`` (on a file system every node sees) makes it resumable: ``scancel
--signal=TERM`` (or any SIGTERM) saves the step the job is at and exits 75; ``--requeue`` then puts the Slurm job
back in the queue, and the next run resumes there. ``--crash-rank R --crash-at S``: rank R raises at step S, to
see the job end in seconds, naming it. Rank 0 writes OUT/final.pt (``torch.load(path)["model"]``).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import ringtrain as rt

FEATURES, CLASSES = 32, 4


def synthetic(n: int) -> TensorDataset:
    """Points labelled by a fixed random linear map: the same data on every node, without a download."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, FEATURES, generator=g)
    y = (x @ torch.randn(FEATURES, CLASSES, generator=g)).argmax(1)
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/cluster", help="folder for final.pt")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2048, help="training set size")
    parser.add_argument("--global-batch", type=int, default=32, help="samples per optimizer step, all processes")
    parser.add_argument("--checkpoint-dir", default=None, help="periodic and preemption checkpoints (shared)")
    parser.add_argument("--save-every", type=int, default=None, help="optimizer steps between checkpoints")
    parser.add_argument("--requeue", action="store_true", help="on preemption, `scontrol requeue` the Slurm job")
    parser.add_argument("--log-every", type=int, default=0, help="print the step every N steps (0: never)")
    parser.add_argument("--crash-rank", type=int, default=None, help="this rank raises at --crash-at")
    parser.add_argument("--crash-at", type=int, default=3)
    args = parser.parse_args()

    ring = rt.Ring(seed=0, device="cpu", global_batch=args.global_batch, checkpoint_dir=args.checkpoint_dir,
                   save_every=args.save_every, requeue=args.requeue)
    print(f"rank {ring.rank} of {ring.world_size}, node {ring.node_rank}, started by {ring.env.name}", flush=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, CLASSES))
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    per_device = args.global_batch // max(ring.world_size, 1)
    train = ring.loader(synthetic(args.samples), batch_size=per_device, shuffle=True, drop_last=True)

    for epoch in ring.epochs(args.epochs):
        for x, y in train:
            step = ring.optimizer_steps
            if ring.rank == args.crash_rank and step == args.crash_at:
                raise RuntimeError(f"rank {ring.rank} crashes at step {step}, as --crash-rank asked")
            loss = F.cross_entropy(model(x), y)
            ring.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if args.log_every and ring.optimizer_steps % args.log_every == 0:
                ring.print(f"step {ring.optimizer_steps} epoch {epoch} loss {loss.item():.4f}", flush=True)
    if ring.is_main:
        os.makedirs(args.out, exist_ok=True)
    ring.save(os.path.join(args.out, "final.pt"), model=model)
    ring.print(f"done: {ring.optimizer_steps} steps on {ring.world_size} process(es), {ring.env.name}; "
               f"{os.path.join(args.out, 'final.pt')}", flush=True)
    ring.close()


if __name__ == "__main__":
    main()
