"""An aliased parser built in a function, the flag among others on a later line."""
from argparse import ArgumentParser as AP

import torch.distributed as D


def parse():
    p = AP(description="train")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument(  # expect: local-rank-arg
        "--local_rank",
        type=int,
        default=-1,
        help="filled in by torch.distributed.launch",
    )
    return p.parse_known_args()[0]


if __name__ == "__main__":
    opts = parse()
    D.init_process_group("gloo")
