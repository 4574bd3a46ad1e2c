"""The same script evaluating through the module inside the wrapper (nanoGPT's raw_model): no collective on one
rank, buffers or not."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

block_size, eval_interval, eval_iters, eval_only = 16, 10, 4, True


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(32, 96)
        self.flash = hasattr(torch.nn.functional, "scaled_dot_product_attention")
        if not self.flash:
            print("WARNING: using slow attention. Flash Attention requires PyTorch >= 2.0")
            self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        q, k, v = self.c_attn(x).split(32, dim=2)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.attn, self.lm_head = nn.Embedding(64, 32), CausalSelfAttention(), nn.Linear(32, 64)

    def forward(self, idx, targets):
        logits = self.lm_head(self.attn(self.wte(idx)))
        return logits, F.cross_entropy(logits.view(-1, 64), targets.view(-1))


def get_batch(split):
    return torch.randint(64, (4, block_size)), torch.randint(64, (4, block_size))


ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="nccl")
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    device = f"cuda:{ddp_local_rank}"
    torch.cuda.set_device(device)
    master_process = int(os.environ["RANK"]) == 0
else:
    master_process, device = True, "cuda"
model = GPT().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])
raw_model = model.module if ddp else model


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
        out[split] = losses.mean()
    model.train()
    return out


iter_num = 0
while True:
    if iter_num % eval_interval == 0 and master_process:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    if iter_num == 0 and eval_only:
        break
    X, Y = get_batch("train")
    logits, loss = model(X, Y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
if ddp:
    destroy_process_group()
