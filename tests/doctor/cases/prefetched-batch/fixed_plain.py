"""The same loop with the draw wrapped by ring.batches: the batch prefetched before a checkpoint is kept in it,
and a resumed run trains it first."""
import os

import torch

import ringtrain as rt

out_dir, max_iters, gradient_accumulation_steps = "out", 100, 4
batch_size, block_size = 4, 16
data = torch.randint(0, 64, (20000,))


def get_batch(split):
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x, y


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.head = torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64)

    def forward(self, idx, targets):
        logits = self.head(self.tok(idx))
        return logits, torch.nn.functional.cross_entropy(logits.view(-1, 64), targets.view(-1))


ring = rt.Ring(checkpoint_dir=os.path.join(out_dir, "ring"), save_every=50, seed=1337)
ring.accumulate = gradient_accumulation_steps
model = GPT()
model, optimizer = ring.setup(model, torch.optim.AdamW(model.parameters(), lr=6e-4))
get_batch = ring.batches(get_batch)  # a drawn, untrained batch rides in the checkpoint
X, Y = get_batch("train")  # fetch the very first batch
for iter_num in ring.steps(max_iters):
    for micro_step in range(gradient_accumulation_steps):
        logits, loss = model(X, Y)
        # immediately async prefetch next batch while model is doing the forward pass on the GPU
        X, Y = get_batch("train")
        ring.backward(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
