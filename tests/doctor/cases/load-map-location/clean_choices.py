"""A load on rank 0 only, and a branch whose sibling maps: both deliberate."""
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
torch.cuda.set_device(dist.get_rank())
if dist.get_rank() == 0:
    weights = torch.load("pretrained.pt")
gpu = None if dist.get_world_size() == 1 else dist.get_rank()
if gpu is None:
    checkpoint = torch.load("resume.pt")
else:
    checkpoint = torch.load("resume.pt", map_location=f"cuda:{gpu}")
# Features saved with .cpu() by an earlier run: not a model's checkpoint, nothing to map.
train_features = torch.load("trainfeat.pth")
