"""A model bigger than one device: FSDP — every rank holds 1/W of the weights, gradients and optimizer state.

Launch:
    ringtrain run --nproc-per-node 2 examples/fsdp.py                    # 2 ranks, each holding half
    ringtrain run --nproc-per-node 4 examples/fsdp.py --replicate 2      # HSDP: shard in pairs, replicate the pairs
    python examples/fsdp.py                                              # one process (FSDP of one: the whole model)
    ringtrain consolidate fsdp_ckpt fsdp_plain.pt                        # the sharded checkpoint as one plain file

The diff from 02_ddp.py: the strategy is rt.strategies.FSDP(...); the model is built on the meta
device (shapes only, no memory), so no rank ever holds it whole — ring.setup shards it, then
allocates and initialises only this rank's shards (each module's reset_parameters(), from the same
random state at any world size); ring.save writes a sharded folder every rank writes its part of,
and ring.load reads it back at any world size. The model is a small vision transformer on the
8x8 digits: each image row is a token.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import ringtrain as rt
from ringtrain.bench.datasets import digits


class Positions(nn.Module):
    """A learned position embedding: a module of its own, with reset_parameters (the meta device needs it)."""

    def __init__(self, tokens: int, width: int):
        super().__init__()
        self.table = nn.Parameter(torch.empty(tokens, width))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.table, std=0.02)

    def forward(self, x):
        return x + self.table


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, width: int = 64, depth: int = 4, heads: int = 4, classes: int = 10):
        super().__init__()
        self.embed = nn.Linear(8, width)  # one image row (8 pixels) -> one token
        self.positions = Positions(8, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))  # FSDP's shard units
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, images):
        x = self.positions(self.embed(images.view(-1, 8, 8)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


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
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--replicate", type=int, default=1, help="HSDP: replica groups (e.g. the number of nodes)")
    parser.add_argument("--precision", default="32", help="32 or bf16-mixed (bf16 weights in compute)")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--checkpoint", default="fsdp_ckpt")
    args = parser.parse_args()

    ring = rt.Ring(strategy=rt.strategies.FSDP(wrap=[Block], replicate=args.replicate), precision=args.precision, seed=0)
    with torch.device("meta"):  # shapes only: no rank ever holds the whole model
        model = ViT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    model, optimizer = ring.setup(model, optimizer)  # shards, then allocates and initialises this rank's part
    ring.print(f"FSDP over {ring.mesh}: {sum(p.numel() for p in ViT().parameters()):,} parameters, units "
               f"{ring.strategy.units}")
    train_set, test_set = digits()
    train = ring.loader(train_set, batch_size=args.batch_size, shuffle=True)
    test = ring.loader(test_set, batch_size=256, exact=True)

    for epoch in ring.epochs(args.epochs):
        for x, y in ring.progress(train, desc=f"epoch {epoch}"):
            loss = F.cross_entropy(model(x), y)
            ring.backward(loss)
            ring.clip_grad_norm_(model, 1.0)  # the norm of the whole gradient, over every rank's shard
            optimizer.step()
            optimizer.zero_grad()
        ring.print(f"epoch {epoch}: loss {loss.item():.4f} held-out accuracy {accuracy(ring, model, test):.4f}")
    ring.save(args.checkpoint, model=model, optimizer=optimizer, epoch=epoch)  # a folder, every rank its shards
    ring.print(f"sharded checkpoint in {args.checkpoint}/; `ringtrain consolidate {args.checkpoint} plain.pt` "
               "makes one file")


if __name__ == "__main__":
    main()
