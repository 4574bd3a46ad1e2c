"""The tutorial's get_reduced_loss(), called under `args.local_rank == 0`."""
import argparse

import torch
import torch.distributed as D


def get_reduced_loss(loss, dest_device):
    loss_tensor = loss.clone()
    D.reduce(loss_tensor, dst=dest_device)  # expect: collective-on-one-rank
    return loss_tensor


def log(args, loss):
    if args.local_rank == 0:
        loss_tensor = get_reduced_loss(loss.detach(), 0)
        print(f"Current batch Loss = {loss_tensor.item()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--local-rank", "--local_rank", type=int, default=0)
    args = parser.parse_args()
    D.init_process_group("gloo")
    log(args, torch.tensor(2.0))
