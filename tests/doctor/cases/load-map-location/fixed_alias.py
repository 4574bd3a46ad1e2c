"""Fixed: map to the CPU, then load_state_dict copies onto each rank's device."""
import argparse

import torch
import torch.distributed as D
from torch import load as tload


def resume(model, optimizer, path):
    ckpt = tload(path, map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    return ckpt["epoch"]


def main(args):
    D.init_process_group("nccl")
    torch.cuda.set_device(args.gpu)
    model = torch.nn.Linear(4, 2).cuda(args.gpu)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start = resume(model, optimizer, args.resume) if args.resume else 0
    return start


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--resume", default="")
    main(parser.parse_args())
