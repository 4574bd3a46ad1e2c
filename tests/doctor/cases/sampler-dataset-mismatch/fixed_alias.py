"""Fixed: one sampler per dataset (and a plain alias of the same dataset is fine)."""
from torch.utils.data import DataLoader as DL, DistributedSampler as DS


def build(train_set, val_set):
    data = train_set
    shard = DS(dataset=data)
    train_loader = DL(dataset=train_set, batch_size=8, sampler=shard)
    val_loader = DL(dataset=val_set, batch_size=8, sampler=DS(val_set, shuffle=False))
    return train_loader, val_loader
