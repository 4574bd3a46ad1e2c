"""The same script finished: ring.backward scales the loss for the Ring's own GradScaler (and divides it by the
window), and optimizer.step() unscales, clips nothing it should not and steps once per window."""
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
for iter_num in ring.steps(max_iters):
    for micro_step in range(gradient_accumulation_steps):
        X, Y = get_batch("train")
        logits, loss = model(X, Y)
        ring.backward(loss)
    ring.clip_grad_norm_(model, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
