"""Fixed: each rank writes its own shard file on purpose; the gathered state is written on rank 0."""
import os

import torch.distributed as dist
from torch import nn
from torch import save as tsave
from torch.distributed._composable.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict


def save_checkpoint(state, folder, name="last.pt"):
    os.makedirs(folder, exist_ok=True)
    tsave(state, os.path.join(folder, name))


class Runner:
    def __init__(self, net):
        self.net = fully_shard(net)
        self.options = StateDictOptions(full_state_dict=True, cpu_offload=True)

    def end_of_epoch(self, epoch):
        ckpt = {"epoch": epoch}
        ckpt["net"] = self.net.state_dict()
        save_checkpoint(ckpt, "runs", f"shard_rank{dist.get_rank()}.pt")

    def export(self):
        full = get_model_state_dict(self.net, options=self.options)
        if dist.get_rank() == 0:
            tsave(full, "final.pt")


if __name__ == "__main__":
    dist.init_process_group("gloo")
    runner = Runner(nn.Linear(8, 2))
    runner.end_of_epoch(0)
    runner.export()
