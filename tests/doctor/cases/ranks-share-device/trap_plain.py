"""The PyTorch DDP tutorial's model-parallel demo: two devices per rank, taken modulo the world size."""
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyMpModel(nn.Module):
    def __init__(self, dev0, dev1):
        super().__init__()
        self.dev0, self.dev1 = dev0, dev1
        self.net1 = nn.Linear(10, 10).to(dev0)
        self.net2 = nn.Linear(10, 5).to(dev1)

    def forward(self, x):
        return self.net2(torch.relu(self.net1(x.to(self.dev0))).to(self.dev1))


def demo_model_parallel(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    dev0 = (rank * 2) % world_size  # expect: ranks-share-device
    dev1 = (rank * 2 + 1) % world_size  # expect: ranks-share-device
    ddp_mp_model = DDP(ToyMpModel(dev0, dev1))
    optimizer = torch.optim.SGD(ddp_mp_model.parameters(), lr=0.001)
    outputs = ddp_mp_model(torch.randn(20, 10))
    nn.MSELoss()(outputs, torch.randn(20, 5).to(dev1)).backward()
    optimizer.step()


if __name__ == "__main__":
    n_gpus = torch.cuda.device_count()
    mp.spawn(demo_model_parallel, args=(n_gpus // 2,), nprocs=n_gpus // 2)
