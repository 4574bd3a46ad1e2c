"""FSDP1 as the PyTorch FSDP tutorial writes it, but with the save helper called on rank 0 only."""
import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def save_model(model, path):
    save_policy = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, save_policy):
        cpu_state = model.state_dict()  # expect: sharded-state-on-one-rank
    torch.save(cpu_state, path)


def fit(args):
    dist.init_process_group("nccl")
    torch.cuda.set_device(args.local_rank)
    net = FSDP(nn.Linear(32, 32).cuda())  # expect: fsdp1-api
    opt = torch.optim.Adam(net.parameters())
    for epoch in range(args.epochs):
        net(torch.randn(4, 32, device="cuda")).sum().backward()
        opt.step()
        if args.rank == 0:
            save_model(net, f"epoch{epoch}.pt")
            osd = FSDP.optim_state_dict(net, opt)  # expect: sharded-state-on-one-rank
            torch.save(osd, "optim.pt")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--local-rank", "--local_rank", type=int, default=0)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=2)
    fit(parser.parse_args())
