"""nanoGPT's train.py converted half-way: the Ring takes the precision (float16 where bfloat16 is missing) and the
accumulation, but the loop keeps its own GradScaler and `scaler.scale(loss).backward()`: the Ring's scaler unscales
gradients that its loss scale never multiplied."""
import torch

import ringtrain as rt

gradient_accumulation_steps, max_iters, batch_size, block_size = 8, 100, 4, 16
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.head = torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64)

    def forward(self, idx, targets):
        logits = self.head(self.tok(idx))
        return logits, torch.nn.functional.cross_entropy(logits.view(-1, 64), targets.view(-1))


def get_batch(split):
    ix = torch.randint(1000, (batch_size,))
    return torch.stack([torch.arange(block_size) + i for i in ix]) % 64, torch.stack(
        [torch.arange(1, block_size + 1) + i for i in ix]) % 64


ring = rt.Ring(precision=dtype)
ring.accumulate = gradient_accumulation_steps = gradient_accumulation_steps // ring.world_size
model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
model, optimizer = ring.setup(model, optimizer)
scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
for iter_num in ring.steps(max_iters):
    for micro_step in range(gradient_accumulation_steps):
        X, Y = get_batch("train")
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        scaler.scale(loss).backward()  # expect: backward-without-ring
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
