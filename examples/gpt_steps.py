"""A step-based GPT training loop (nanoGPT's train.py, as tests/clients/nanogpt_train.py has it) converted to
ringtrain: the same get_batch(), estimate_loss(), cosine learning rate and checkpoint, plus periodic checkpoints
that a restart resumes exactly, and any strategy. The diff to the original is in docs/from-a-script.md. Tiny model,
synthetic tokens.

    python examples/gpt_steps.py --out_dir out                                   # one process
    ringtrain run --nproc-per-node 2 --max-restarts 1 examples/gpt_steps.py      # DDP; a killed rank resumes
    RINGTRAIN_STRATEGY=fsdp ringtrain run --nproc-per-node 2 examples/gpt_steps.py --out_dir out-fsdp   # FSDP
"""

import argparse
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import ringtrain as rt

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", default="out")
parser.add_argument("--max_iters", type=int, default=20)
parser.add_argument("--eval_interval", type=int, default=10)
args = parser.parse_args()
out_dir, max_iters, eval_interval = args.out_dir, args.max_iters, args.eval_interval
eval_iters, log_interval = 4, 5
gradient_accumulation_steps = 4  # used to simulate larger batch sizes
batch_size, block_size = 4, 16
n_layer, n_head, n_embd, vocab_size = 2, 2, 32, 64
learning_rate, min_lr, warmup_iters, weight_decay = 1e-3, 1e-4, 4, 0.1
device, dtype = "cpu", "float32"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.register_buffer("bias", torch.triu(torch.ones(block_size, block_size, dtype=torch.bool), 1))

    def forward(self, x):
        t = x.size(1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.bias[:t, :t], need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, **model_args):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block() for _ in range(n_layer)])
        self.head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1), device=idx.device))
        logits = self.head(self.blocks(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


ring = rt.Ring(os.environ.get("RINGTRAIN_STRATEGY", "auto"), precision=dtype,
               checkpoint_dir=os.path.join(out_dir, "ring"), save_every=5)
master_process, seed_offset = ring.is_main, ring.rank
ring.accumulate = gradient_accumulation_steps = gradient_accumulation_steps // ring.world_size
os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(1337 + seed_offset)
data = np.random.default_rng(0).integers(0, vocab_size, 20000, dtype=np.int64)  # the token array
train_data, val_data = data[:18000], data[18000:]


def get_batch(split):
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].copy()) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].copy()) for i in ix])
    return x.to(device), y.to(device)


get_batch = ring.batches(get_batch)  # the batch prefetched across a checkpoint rides in it: resumes exactly
iter_num, best_val_loss = 0, 1e9
model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, vocab_size=vocab_size)
torch.manual_seed(1337)  # the same initial weights on every rank
model = GPT(**model_args).to(device)
torch.manual_seed(1337 + seed_offset)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=weight_decay)
model, optimizer = ring.setup(model, optimizer)
best_val_loss = ring.extras.setdefault("best_val_loss", best_val_loss)  # a resumed run's, from its checkpoint


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            logits, loss = raw_model(X, Y)
            losses[k] = loss.item()
        out[split] = ring.all_reduce(losses.mean())
    model.train()
    return out


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = (it - warmup_iters) / (max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


X, Y = get_batch("train")  # fetch the very first batch
raw_model = ring.unwrap(model)  # unwrap DDP container if needed
for iter_num in ring.steps(max_iters + 1):
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        ring.print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}", flush=True)
        if losses["val"] < best_val_loss or iter_num == max_iters:
            best_val_loss = ring.extras["best_val_loss"] = losses["val"].item()
            if iter_num > 0:
                checkpoint = {"model": model, "optimizer": optimizer,
                              "model_args": model_args, "iter_num": iter_num, "best_val_loss": best_val_loss}
                ring.save(os.path.join(out_dir, "ckpt.pt"), **checkpoint)
    if iter_num >= max_iters:
        break
    for micro_step in range(gradient_accumulation_steps):
        logits, loss = model(X, Y)
        X, Y = get_batch("train")  # immediately prefetch the next batch, as nanoGPT's train.py does
        ring.backward(loss)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if iter_num % log_interval == 0 and master_process:
        print(f"iter {iter_num}: loss {loss.item():.4f}, lr {lr:.2e}", flush=True)
ring.save(os.path.join(out_dir, "final.pt"), full=True, model=model)
