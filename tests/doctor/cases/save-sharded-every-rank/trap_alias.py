"""A save helper under an alias, the checkpoint dict filled item by item, and a full state
gathered to rank 0 on the CPU (the other ranks get an empty dict) then written everywhere."""
import os

import torch.distributed as dist
from torch import nn
from torch import save as tsave
from torch.distributed._composable.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict


def save_checkpoint(state, folder, name="last.pt"):
    os.makedirs(folder, exist_ok=True)
    tsave(state, os.path.join(folder, name))  # expect: save-sharded-every-rank


class Runner:
    def __init__(self, net):
        self.net = fully_shard(net)
        self.options = StateDictOptions(full_state_dict=True, cpu_offload=True)

    def end_of_epoch(self, epoch):
        ckpt = {"epoch": epoch}
        ckpt["net"] = self.net.state_dict()
        save_checkpoint(ckpt, "runs")

    def export(self):
        tsave(get_model_state_dict(self.net, options=self.options), "final.pt")  # expect: save-sharded-every-rank


if __name__ == "__main__":
    dist.init_process_group("gloo")
    runner = Runner(nn.Linear(8, 2))
    runner.end_of_epoch(0)
    runner.export()
