"""Fixed: the helper shards the model before the Trainer builds its optimizer."""
import torch
import torch.distributed as D
import torch.nn.functional as F
from torch import nn, optim
from torch.distributed._composable.fsdp import fully_shard as shard


def apply_fsdp(module, blocks):
    for block in blocks:
        shard(block, reshard_after_forward=True)
    shard(module)
    return module


class Trainer:
    def __init__(self, model, lr):
        self.model = model
        decay = [p for n, p in self.model.named_parameters() if not n.endswith("bias")]
        self.opt = optim.AdamW([{"params": decay, "weight_decay": 0.1}], lr=lr)

    def step(self, x, y):
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()


if __name__ == "__main__":
    D.init_process_group("gloo")
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    apply_fsdp(net, [net[0], net[2]])
    trainer = Trainer(net, 1e-3)
    for _ in range(10):
        trainer.step(torch.randn(4, 8), torch.randint(0, 2, (4,)))
