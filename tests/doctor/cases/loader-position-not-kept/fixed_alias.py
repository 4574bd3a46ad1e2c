"""The same loader with a state_dict, kept by the ring where it is made: ring.keep returns what it is given."""
import glob

import numpy as np
import torch
from ringtrain import Ring


class DistributedDataLoader:
    def __init__(self, filename_pattern, B, T, process_rank, num_processes):
        self.process_rank, self.num_processes, self.B, self.T = process_rank, num_processes, B, T
        self.files = sorted(glob.glob(filename_pattern))
        self.current_shard = None
        self.reset()

    def reset(self):
        if self.current_shard != 0:
            self.current_shard = 0
            self.tokens = np.load(self.files[self.current_shard])
        self.current_position = self.process_rank * self.B * self.T

    def advance(self):
        self.current_shard = (self.current_shard + 1) % len(self.files)
        self.current_position = self.process_rank * self.B * self.T
        self.tokens = np.load(self.files[self.current_shard])

    def next_batch(self):
        B, T = self.B, self.T
        buf = torch.tensor(self.tokens[self.current_position:self.current_position + B * T + 1].astype(np.int64))
        self.current_position += B * T * self.num_processes
        if self.current_position + (B * T * self.num_processes + 1) > len(self.tokens):
            self.advance()
        return buf[:-1].view(B, T), buf[1:].view(B, T)

    def state_dict(self):
        return {"current_shard": self.current_shard, "current_position": self.current_position}

    def load_state_dict(self, state):
        self.current_shard, self.current_position = state["current_shard"], state["current_position"]
        self.tokens = np.load(self.files[self.current_shard])


def main(model, args, resume=None):
    ring = Ring(precision="bf16-mixed")
    loader = ring.keep(DistributedDataLoader(args.input_bin, args.B, args.T, ring.rank, ring.world_size))
    model, optimizer = ring.setup(model, torch.optim.AdamW(model.parameters(), lr=args.learning_rate))
    if resume:
        ring.load(resume, model=model, optimizer=optimizer)
    for step in ring.steps(args.num_iterations):
        if args.overfit_single_batch:
            loader.reset()
        x, y = loader.next_batch()
        _, loss = model(x, y)
        ring.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 1000 == 0:
            ring.save(f"ckpt_{step}.pt", model=model, optimizer=optimizer)
