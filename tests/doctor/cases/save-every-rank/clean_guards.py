"""Rank checks as scripts spell them: local_rank in (-1, 0), is_main flags, rank % ngpus, a gpu id."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main_worker(gpu, ngpus_per_node, args):
    dist.init_process_group("gloo", rank=args.rank * ngpus_per_node + gpu, world_size=args.world_size)
    model = DDP(torch.nn.Linear(4, 2))
    if args.local_rank in [-1, 0]:
        torch.save(model.state_dict(), "a.pt")
    if not args.multiprocessing_distributed or args.rank % ngpus_per_node == 0:
        torch.save(model.state_dict(), "b.pt")
    if gpu == 0:
        torch.save(model.state_dict(), "c.pt")
    is_master = dist.get_rank() == 0
    if is_master:
        torch.save(model.state_dict(), "d.pt")
    if args.local_rank != 0:
        return
    torch.save(model.state_dict(), "e.pt")


def unused_helper(obj):
    # never called in this file: nothing justifies a report
    torch.save(obj, "f.pt")
