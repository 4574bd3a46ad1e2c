"""Keyword arguments, aliases, the sampler built from another name in a helper."""
from torch.utils.data import DataLoader as DL, DistributedSampler as DS


def build(train_set, val_set):
    shard = DS(dataset=train_set)
    train_loader = DL(dataset=train_set, batch_size=8, sampler=shard)
    val_loader = DL(dataset=val_set, batch_size=8, sampler=shard)  # expect: sampler-dataset-mismatch
    return train_loader, val_loader
