"""Fixed: every rank builds the state (the gather with it), rank 0 alone writes."""
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


def rank_zero_only(fn):
    def wrapped(*args, **kwargs):
        if dist.get_rank() == 0:
            return fn(*args, **kwargs)
    return wrapped


class Trainer:
    def __init__(self, model):
        self.model = model
        for block in self.model.blocks:
            fully_shard(block)
        fully_shard(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters())

    def checkpoint(self, path):
        weights = {k: v.full_tensor() for k, v in self.model.state_dict().items()}
        if dist.get_rank() != 0:
            return
        self.write(weights, path)

    @rank_zero_only
    def write(self, weights, path):
        torch.save(weights, path)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


if __name__ == "__main__":
    dist.init_process_group("gloo")
    trainer = Trainer(Net())
    trainer.checkpoint("ckpt.pt")
