"""build-nanogpt's train_gpt2.py loop with its validation reduce moved under the master process's log: every rank
all-reduces the training loss each step (`if ddp:`), so the doctor once took that for the pair of the master's
all_reduce; it is not — rank 0 runs both and the ranks' all_reduce calls fall out of step (Gloo: "Received data
size doesn't match"; NCCL: a hang)."""
import os

import torch
import torch.distributed as dist
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="gloo")
    ddp_rank = int(os.environ["RANK"])
    master_process = ddp_rank == 0
else:
    ddp_rank, master_process = 0, True
model = torch.nn.Linear(8, 8)
if ddp:
    model = DDP(model)
raw_model = model.module if ddp else model
optimizer = torch.optim.AdamW(raw_model.parameters(), lr=6e-4)
max_steps, grad_accum_steps = 20, 2
for step in range(max_steps):
    last_step = step == max_steps - 1
    if (step % 5 == 0 or last_step) and master_process:
        with torch.no_grad():
            val = torch.stack([raw_model(torch.randn(4, 8)).pow(2).mean() for _ in range(4)])
            stats = torch.stack([val.sum(), torch.tensor(float(len(val)))])
        if ddp:
            dist.all_reduce(stats, op=dist.ReduceOp.SUM)  # expect: collective-on-one-rank
        print(f"step {step}: validation loss {(stats[0] / stats[1]).item():.4f}")
    optimizer.zero_grad()
    loss_accum = torch.zeros(())
    for micro_step in range(grad_accum_steps):
        loss = model(torch.randn(4, 8)).pow(2).mean() / grad_accum_steps
        loss_accum += loss.detach()
        loss.backward()
    if ddp:
        dist.all_reduce(loss_accum, op=dist.ReduceOp.AVG)
    optimizer.step()
    if master_process:
        print(f"step {step:5d} | loss: {loss_accum.item():.6f}")
if ddp:
    destroy_process_group()
