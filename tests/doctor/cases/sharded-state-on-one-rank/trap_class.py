"""In a Trainer: an early return off rank 0, the state stored item by item into a dict, and a
gather done by hand with full_tensor() inside a @rank_zero_only method."""
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
        if dist.get_rank() != 0:
            return
        ckpt = {}
        ckpt["model"] = self.model.state_dict()  # expect: sharded-state-on-one-rank
        ckpt["optimizer"] = self.optimizer.state_dict()  # expect: sharded-state-on-one-rank
        torch.save(ckpt, path)

    @rank_zero_only
    def export(self, path):
        weights = {k: v.full_tensor() for k, v in self.model.state_dict().items()}  # expect: sharded-state-on-one-rank
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
    trainer.export("weights.pt")
