"""The same script with DataLoaderLite's position in a state_dict() and the loader handed to ring.keep: each
rank's shard and position ride in every checkpoint, and a resumed run continues there."""
import os

import torch

import ringtrain as rt


class DataLoaderLite:
    def __init__(self, B, T, process_rank, num_processes, split):
        self.B, self.T = B, T
        self.process_rank, self.num_processes = process_rank, num_processes
        self.shards = sorted(s for s in os.listdir("edu_fineweb10B") if split in s)
        self.reset()

    def reset(self):
        self.current_shard = 0
        self.tokens = torch.load(os.path.join("edu_fineweb10B", self.shards[self.current_shard]))
        self.current_position = self.B * self.T * self.process_rank

    def next_batch(self):
        B, T = self.B, self.T
        buf = self.tokens[self.current_position:self.current_position + B * T + 1]
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
        self.current_position += B * T * self.num_processes
        if self.current_position + (B * T * self.num_processes + 1) > len(self.tokens):
            self.current_shard = (self.current_shard + 1) % len(self.shards)
            self.tokens = torch.load(os.path.join("edu_fineweb10B", self.shards[self.current_shard]))
            self.current_position = B * T * self.process_rank
        return x, y

    def state_dict(self):
        return {"current_shard": self.current_shard, "current_position": self.current_position}

    def load_state_dict(self, state):
        self.current_shard = state["current_shard"]
        self.tokens = torch.load(os.path.join("edu_fineweb10B", self.shards[self.current_shard]))
        self.current_position = state["current_position"]


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.head = torch.nn.Embedding(50304, 64), torch.nn.Linear(64, 50304)

    def forward(self, idx, targets=None):
        logits = self.head(self.tok(idx))
        return logits, torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


B, T, max_steps, total_batch_size = 16, 1024, 19073, 524288
ring = rt.Ring(global_batch=total_batch_size // T, precision="bf16-mixed", checkpoint_dir="log/ring", save_every=500)
train_loader = DataLoaderLite(B=B, T=T, process_rank=ring.rank, num_processes=ring.world_size, split="train")
ring.keep(train_loader)
val_loader = DataLoaderLite(B=B, T=T, process_rank=ring.rank, num_processes=ring.world_size, split="val")
model = GPT()
model, optimizer = ring.setup(model, torch.optim.AdamW(model.parameters(), lr=6e-4))
for step in ring.steps(max_steps):
    if step % 250 == 0:
        model.eval()
        val_loader.reset()
        with torch.no_grad():
            val_loss = sum(model(*val_loader.next_batch())[1].item() for _ in range(20)) / 20
        ring.print(f"validation loss: {val_loss:.4f}")
        model.train()
    for micro_step in range(ring.accumulate):
        x, y = train_loader.next_batch()
        logits, loss = model(x, y)
        ring.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
