"""Fixed: integer division of integers (`128 // float(size)` would still be a float)."""
import torch
import torch.distributed as dist


def partition_dataset(partition):
    size = dist.get_world_size()
    bsz = 128 // size
    train_set = torch.utils.data.DataLoader(partition, batch_size=bsz, shuffle=True)
    return train_set, bsz
