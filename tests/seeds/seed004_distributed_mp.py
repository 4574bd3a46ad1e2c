"""Seed 004, step 6, ``distributed_mp.py``: the same ``main_worker``, started by
``torch.multiprocessing.spawn`` -- with ``rt.spawn`` in its place (the same contract:
``main_worker(i, *args)`` in process i), so a failing process is named and the others stopped.

Started as the seed starts it:
    CUDA_VISIBLE_DEVICES=0,1,2,3 python distributed_mp.py
    ->  python seed004_distributed_mp.py --port PORT
"""

import torch

import ringtrain as rt
from seed004_distributed import main_worker, parser


def main():
    args = parser.parse_args()
    args.nprocs = torch.cuda.device_count() or 2  # CPU: no GPUs to count; two processes
    # the seed: mp.spawn(main_worker, nprocs=args.nprocs, args=(args.nprocs, args))
    rt.spawn(main_worker, nprocs=args.nprocs, args=(args.nprocs, args))


if __name__ == "__main__":
    main()
