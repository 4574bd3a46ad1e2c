"""The step loops real GPT scripts have, converted to the Ring, for kill -9 and self-check tests (issue 36):

    ringtrain run --nproc-per-node 2 --max-restarts 1 _prefetch_jobs.py --out OUT --loop prefetch|shards
        [--strategy fsdp] [--kill-at N] [--plain]

``--loop prefetch`` is nanoGPT's train.py loop as its author wrote it: ``get_batch(split)`` draws random offsets
from the global RNG; ``X, Y = get_batch('train')`` once before the loop and again right after each forward (the
prefetch), ``estimate_loss`` drawing random batches of both splits every ``EVAL`` steps, dropout in the model.
``--loop shards`` is build-nanogpt's train_gpt2.py loop: a ``DataLoaderLite`` walking token shards with its own
position (each rank at its own offset), given ``state_dict``/``load_state_dict``, drawn at the top of each
micro-step, a validation loader reset at each evaluation. Converted as docs/exact-resume.md says: ``get_batch =
ring.batches(get_batch)`` (prefetch) or ``ring.keep(train_loader)`` (shards) — ``--plain`` leaves that one line out,
the script as a user converts it who missed it. ``--kill-at N``: rank 1 SIGKILLs itself at its N-th
``ring.backward`` of the first attempt. Writes OUT/params.pt (rank 0) and OUT/losses.rank{r}.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal

import torch
import torch.nn.functional as F
from torch import nn

import ringtrain as rt

STEPS, EVAL, ACCUM, B, T, VOCAB = 12, 4, 2, 4, 8, 48
DATA = {split: torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))
        for split, n, seed in (("train", 3000, 1), ("val", 600, 2))}
SHARDS = [DATA["train"][i * 700:(i + 1) * 700] for i in range(4)]  # small shards: the loader wraps to the next


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, 16)
        self.drop = nn.Dropout(0.1)  # random numbers in every forward, as a GPT with dropout draws them
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.head = nn.Linear(16, VOCAB)

    def forward(self, idx, targets=None):
        x = self.drop(self.wte(idx))
        logits = self.head(x + self.mlp(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
        return logits, loss


def get_batch(split):  # nanoGPT's, on in-memory tokens
    data = DATA[split]
    ix = torch.randint(len(data) - T, (B,))
    x = torch.stack([data[i:i + T] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + T] for i in ix])
    return x, y


class DataLoaderLite:  # build-nanogpt's, on in-memory shards, with the two methods a conversion adds
    def __init__(self, B, T, process_rank, num_processes, shards):
        self.B, self.T, self.process_rank, self.num_processes, self.shards = B, T, process_rank, num_processes, shards
        self.reset()

    def reset(self):
        self.current_shard = 0
        self.tokens = self.shards[self.current_shard]
        self.current_position = self.B * self.T * self.process_rank

    def next_batch(self):
        B, T = self.B, self.T
        buf = self.tokens[self.current_position: self.current_position + B * T + 1]
        x = (buf[:-1]).view(B, T)
        y = (buf[1:]).view(B, T)
        self.current_position += B * T * self.num_processes
        if self.current_position + (B * T * self.num_processes + 1) > len(self.tokens):
            self.current_shard = (self.current_shard + 1) % len(self.shards)
            self.tokens = self.shards[self.current_shard]
            self.current_position = B * T * self.process_rank
        return x, y

    def state_dict(self):
        return {"shard": self.current_shard, "position": self.current_position}

    def load_state_dict(self, state):
        self.current_shard, self.current_position = state["shard"], state["position"]
        self.tokens = self.shards[self.current_shard]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--loop", choices=["prefetch", "shards"], required=True)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--plain", action="store_true", help="leave out the conversion's ring.batches/ring.keep line")
    args = parser.parse_args()
    global get_batch
    ring = rt.Ring(args.strategy, seed=0, accumulate=ACCUM, checkpoint_dir=os.path.join(args.out, "ckpt"),
                   save_every=3)
    torch.manual_seed(0)
    model = TinyGPT()
    model, optimizer = ring.setup(model, torch.optim.AdamW(model.parameters(), lr=3e-3))
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    losses, backwards = [], 0

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ["train", "val"]:
            values = []
            for _ in range(2):
                X, Y = get_batch(split)
                values.append(model(X, Y)[1].item())
            out[split] = sum(values) / len(values)
        model.train()
        return out

    if args.loop == "prefetch":
        if not args.plain:
            get_batch = ring.batches(get_batch)
        X, Y = get_batch("train")  # fetch the very first batch
        for step in ring.steps(STEPS):
            if step % EVAL == 0:
                losses.append(["eval", step, estimate_loss()])
            for micro_step in range(ring.accumulate):
                backwards += 1
                if args.kill_at and backwards == args.kill_at and ring.rank == 1 and first_attempt:
                    os.kill(os.getpid(), signal.SIGKILL)
                logits, loss = model(X, Y)
                X, Y = get_batch("train")  # immediately async prefetch next batch
                ring.backward(loss)
                losses.append([step, micro_step, loss.item()])
            ring.clip_grad_norm_(model, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    else:
        train_loader = DataLoaderLite(B, T, ring.rank, ring.world_size, SHARDS)
        val_loader = DataLoaderLite(B, T, ring.rank, ring.world_size, [DATA["val"]])
        if not args.plain:
            ring.keep(train_loader)
        for step in ring.steps(STEPS):
            if step % EVAL == 0:
                val_loader.reset()
                with torch.no_grad():
                    x, y = val_loader.next_batch()
                    losses.append(["eval", step, model(x, y)[1].item()])
            for micro_step in range(ring.accumulate):
                backwards += 1
                if args.kill_at and backwards == args.kill_at and ring.rank == 1 and first_attempt:
                    os.kill(os.getpid(), signal.SIGKILL)
                x, y = train_loader.next_batch()
                logits, loss = model(x, y)
                ring.backward(loss)
                losses.append([step, micro_step, loss.item()])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    state = ring.strategy.module_state(model)
    if ring.rank == 0:
        torch.save(state, os.path.join(args.out, "params.pt"))
    with open(os.path.join(args.out, f"losses.rank{ring.rank}.json"), "w") as f:
        json.dump(losses, f)
    ring.close()


if __name__ == "__main__":
    main()
