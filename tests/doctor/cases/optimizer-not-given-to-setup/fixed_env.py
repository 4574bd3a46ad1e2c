"""The same script with the optimizer handed to ring.setup: under any strategy it steps what the model holds."""
import os

import torch

import ringtrain as rt


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.head = torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64)

    def forward(self, idx, targets):
        logits = self.head(self.tok(idx))
        return logits, torch.nn.functional.cross_entropy(logits.view(-1, 64), targets.view(-1))

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        decay = [p for p in self.parameters() if p.dim() >= 2]
        rest = [p for p in self.parameters() if p.dim() < 2]
        return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest}],
                                 lr=learning_rate, betas=betas)


def get_batch(split):
    return torch.randint(64, (4, 16)), torch.randint(64, (4, 16))


ring = rt.Ring(os.environ.get("RINGTRAIN_STRATEGY", "auto"), precision="bf16-mixed")
model = GPT()
optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95))
model, optimizer = ring.setup(model, optimizer)
for iter_num in ring.steps(100):
    X, Y = get_batch("train")
    logits, loss = model(X, Y)
    ring.backward(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
