"""Left alone: the same kind of loader in a Ring script that never checkpoints, an evaluation loader, one whose
position the script puts in ring.extras and sets back itself, and a class whose next_batch draws at random
(no position to keep)."""
import torch

import ringtrain as rt


class TokenLoader:
    def __init__(self, tokens, B, T):
        self.tokens, self.B, self.T, self.pos = tokens, B, T, 0

    def next_batch(self):
        buf = self.tokens[self.pos:self.pos + self.B * self.T + 1]
        self.pos += self.B * self.T
        return buf[:-1].view(self.B, self.T), buf[1:].view(self.B, self.T)


class RandomBatches:
    def __init__(self, tokens, B, T):
        self.tokens, self.B, self.T = tokens, B, T

    def next_batch(self):
        ix = torch.randint(len(self.tokens) - self.T, (self.B,))
        return torch.stack([self.tokens[i:i + self.T] for i in ix]), torch.stack([self.tokens[i + 1:i + 1 + self.T] for i in ix])


def no_checkpoints(model, optimizer, tokens):
    ring = rt.Ring()
    model, optimizer = ring.setup(model, optimizer)
    loader = TokenLoader(tokens, 4, 64)
    for step in ring.steps(100):
        ring.backward(model(*loader.next_batch())[1])
        optimizer.step()


def by_hand(model, optimizer, tokens):
    ring = rt.Ring(checkpoint_dir="ckpt", save_every=10)
    model, optimizer = ring.setup(model, optimizer)
    loader = TokenLoader(tokens, 4, 64)
    val_loader = TokenLoader(tokens[-10000:], 4, 64)
    loader.pos = ring.extras.setdefault("pos", 0)
    randomly = RandomBatches(tokens, 4, 64)
    for step in ring.steps(100):
        ring.extras["pos"] = loader.pos
        ring.backward(model(*loader.next_batch())[1] + model(*randomly.next_batch())[1])
        optimizer.step()
        if step % 10 == 0:
            with torch.no_grad():
                print(model(*val_loader.next_batch())[1].item())
