"""A step-based GPT script converted to ringtrain so that a restarted job resumes exactly: nanoGPT's train.py loop
(its get_batch() prefetch: the first batch before the loop, the next one right after each forward) drawing from
build-nanogpt's DataLoaderLite (token shards walked with current_shard / current_position), with periodic
checkpoints. The two things a checkpoint cannot see by itself are handed to the ring: the loader, with
ring.keep(train_loader) (its position rides in every checkpoint, per rank), and the draw, with
get_batch = ring.batches(get_batch) (a batch prefetched before a checkpoint rides in it). Tiny model, synthetic
tokens.

    ringtrain run --nproc-per-node 2 --max-restarts 1 gpt_resumable.py
"""
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import ringtrain as rt

out_dir, max_iters, eval_interval, eval_iters = "out", 200, 50, 4
B, T, total_batch_size = 4, 16, 4 * 16 * 8
n_embd, vocab_size = 32, 64
learning_rate, min_lr, warmup_iters = 1e-3, 1e-4, 10
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"


class DataLoaderLite:
    def __init__(self, B, T, process_rank, num_processes, shards):
        self.B, self.T = B, T
        self.process_rank, self.num_processes = process_rank, num_processes
        self.shards = shards
        self.reset()

    def reset(self):
        self.current_shard = 0
        self.tokens = torch.from_numpy(self.shards[self.current_shard])
        self.current_position = self.B * self.T * self.process_rank

    def next_batch(self):
        B, T = self.B, self.T
        buf = self.tokens[self.current_position:self.current_position + B * T + 1]
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
        self.current_position += B * T * self.num_processes
        if self.current_position + (B * T * self.num_processes + 1) > len(self.tokens):
            self.current_shard = (self.current_shard + 1) % len(self.shards)
            self.tokens = torch.from_numpy(self.shards[self.current_shard])
            self.current_position = B * T * self.process_rank
        return x, y

    def state_dict(self):
        return {"current_shard": self.current_shard, "current_position": self.current_position}

    def load_state_dict(self, state):
        self.current_shard = state["current_shard"]
        self.tokens = torch.from_numpy(self.shards[self.current_shard])
        self.current_position = state["current_position"]


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(T, n_embd)
        self.block = nn.TransformerEncoderLayer(n_embd, 2, 4 * n_embd, batch_first=True, norm_first=True)
        self.lm_head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        mask = nn.Transformer.generate_square_subsequent_mask(idx.size(1), device=idx.device)
        logits = self.lm_head(self.block(x, src_mask=mask, is_causal=True))
        return logits, F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1))


ring = rt.Ring(os.environ.get("RINGTRAIN_STRATEGY", "auto"), precision=dtype, global_batch=total_batch_size // T,
               checkpoint_dir=os.path.join(out_dir, "ring"), save_every=25, seed=1337)
master_process = ring.is_main
rng = np.random.default_rng(0)
shards = [rng.integers(0, vocab_size, 50000, dtype=np.int64) for _ in range(3)]
train_loader = DataLoaderLite(B, T, ring.rank, ring.world_size, shards[:2])
val_loader = DataLoaderLite(B, T, ring.rank, ring.world_size, shards[2:])
ring.keep(train_loader)


def get_batch(split):
    x, y = (train_loader if split == "train" else val_loader).next_batch()
    return x.to(ring.device), y.to(ring.device)


get_batch = ring.batches(get_batch)
model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.1)
model, optimizer = ring.setup(model, optimizer)
best_val_loss = ring.extras.setdefault("best_val_loss", 1e9)
raw_model = ring.unwrap(model)


@torch.no_grad()
def estimate_loss():
    model.eval()
    val_loader.reset()
    losses = torch.stack([raw_model(*get_batch("val"))[1] for _ in range(eval_iters)])
    model.train()
    return ring.all_reduce(losses.mean())


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = (it - warmup_iters) / (max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


X, Y = get_batch("train")  # fetch the very first batch
for iter_num in ring.steps(max_iters):
    for param_group in optimizer.param_groups:
        param_group["lr"] = get_lr(iter_num)
    if iter_num % eval_interval == 0:
        val_loss = estimate_loss()
        ring.print(f"step {iter_num}: val loss {val_loss:.4f}")
        if val_loss < best_val_loss:
            best_val_loss = ring.extras["best_val_loss"] = val_loss.item()
    for micro_step in range(ring.accumulate):
        logits, loss = model(X, Y)
        X, Y = get_batch("train")  # prefetch the next batch while the GPU runs the forward
        ring.backward(loss)
    ring.clip_grad_norm_(model, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if iter_num % 10 == 0 and master_process:
        print(f"iter {iter_num}: loss {loss.item():.4f}", flush=True)
ring.save(os.path.join(out_dir, "final.pt"), full=True, model=model)
