"""Arithmetic that looks alike but shares no device: one device per rank, a modulus that is the GPU
count, a rank pairing that names processes (not devices)."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
n_gpus = torch.cuda.device_count()
device = torch.device("cuda", rank % n_gpus)
dev0 = (rank * 2) % n_gpus
dev1 = (rank * 2 + 1) % torch.cuda.device_count()
partner = (rank * 2) % world_size  # a process, not a device
dist.send(torch.zeros(1), dst=partner)

