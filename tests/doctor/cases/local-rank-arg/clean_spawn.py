"""mp.spawn passes the rank itself; nobody ever sends --local_rank, so declaring it is harmless."""
import argparse

import torch.distributed as dist
import torch.multiprocessing as mp


def main_worker(local_rank, nprocs, args):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:23456", world_size=nprocs, rank=local_rank)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", default=-1, type=int)
    args = parser.parse_args()
    mp.spawn(main_worker, nprocs=2, args=(2, args))
