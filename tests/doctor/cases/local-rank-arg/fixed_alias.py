"""Fixed: the dashed spelling is declared too (a second add_argument with the same dest)."""
import os
from argparse import ArgumentParser as AP

import torch.distributed as D


def parse():
    p = AP(description="train")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument(
        "--local_rank",
        type=int,
        default=int(os.environ.get("LOCAL_RANK", -1)),
        help="filled in by torch.distributed.launch",
    )
    p.add_argument("--local-rank", dest="local_rank", type=int)
    return p.parse_known_args()[0]


if __name__ == "__main__":
    opts = parse()
    D.init_process_group("gloo")
