"""nanoGPT's train.py shape: estimate_loss() runs the DDP model on the master process only; after the
last evaluation the loop ends, and the other ranks leave while rank 0 waits in DDP's buffer broadcast."""
import os

import torch
import torch.nn as nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

eval_interval, eval_iters, max_iters = 10, 4, 100
gradient_accumulation_steps = 8


class GPT(nn.Module):
    def __init__(self, block_size=16):
        super().__init__()
        self.head = nn.Linear(32, 64)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)))

    def forward(self, idx, targets):
        logits = self.head(idx.float())
        return logits, nn.functional.cross_entropy(logits.view(-1, 64), targets.view(-1))


def get_batch(split):
    return torch.randn(4, 32), torch.randint(0, 64, (4,))


ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="nccl")
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    device = f"cuda:{ddp_local_rank}"
    torch.cuda.set_device(device)
    master_process = ddp_rank == 0
else:
    master_process, device = True, "cuda"
model = GPT().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            logits, loss = model(X, Y)  # expect: eval-on-one-rank-through-ddp
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


iter_num = 0
while True:
    if iter_num % eval_interval == 0 and master_process:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    if iter_num >= max_iters:
        break
    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        X, Y = get_batch("train")
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
if ddp:
    destroy_process_group()
