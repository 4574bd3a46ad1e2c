"""PyTorch's "Writing Distributed Applications" tutorial: the global batch of 128 divided by a float."""
import torch
import torch.distributed as dist


def partition_dataset(partition):
    size = dist.get_world_size()
    bsz = 128 / float(size)
    train_set = torch.utils.data.DataLoader(partition, batch_size=bsz, shuffle=True)  # expect: batch-size-float
    return train_set, bsz
