"""The same loop with the loader's draw wrapped by ring.batches: the prefetched batch rides in the checkpoint
too, beside the position ring.keep keeps."""
from ringtrain import Ring


class DataLoaderLite:
    def __init__(self, B, T, tokens, process_rank, num_processes):
        self.B, self.T, self.tokens = B, T, tokens
        self.process_rank, self.num_processes = process_rank, num_processes
        self.current_position = B * T * process_rank

    def next_batch(self):
        B, T = self.B, self.T
        buf = self.tokens[self.current_position:self.current_position + B * T + 1]
        self.current_position += B * T * self.num_processes
        if self.current_position + (B * T * self.num_processes + 1) > len(self.tokens):
            self.current_position = B * T * self.process_rank
        return buf[:-1].view(B, T), buf[1:].view(B, T)

    def state_dict(self):
        return {"current_position": self.current_position}

    def load_state_dict(self, state):
        self.current_position = state["current_position"]


def train(model, optimizer, tokens, max_steps=1000):
    ring = Ring(checkpoint_dir="ckpt", save_every=100)
    model, optimizer = ring.setup(model, optimizer)
    train_loader = ring.keep(DataLoaderLite(4, 64, tokens, ring.rank, ring.world_size))
    train_loader.next_batch = ring.batches(train_loader.next_batch)
    x, y = train_loader.next_batch()
    step = 0
    while step < max_steps:
        logits, loss = model(x, y)
        x, y = train_loader.next_batch()
        ring.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        step += 1
