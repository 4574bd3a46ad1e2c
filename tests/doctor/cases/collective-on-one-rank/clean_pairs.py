"""Rank-specific calls that pair up: barrier idiom, gather with and without a list, a subgroup."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank != 0:
    dist.barrier()  # wait while rank 0 downloads
if rank == 0:
    dist.barrier()
t = torch.tensor([float(rank)])
if rank == 0:
    parts = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.gather(t, parts, dst=0)
else:
    dist.gather(t, dst=0)
group = dist.new_group([0, 1])
if rank in (0, 1):
    dist.all_reduce(t, group=group)
if rank == 0:
    dist.send(t, dst=1)
elif rank == 1:
    dist.recv(t, src=0)
