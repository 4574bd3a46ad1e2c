"""Fixed: the epoch loop sets the sampler's epoch."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train_set = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
val_set = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
train_sampler = DistributedSampler(train_set)
train_loader = DataLoader(train_set, batch_size=8, sampler=train_sampler)
val_loader = DataLoader(val_set, batch_size=8)

epoch = 0
while epoch < 5:
    train_sampler.set_epoch(epoch)
    for phase, loader in [("train", train_loader), ("val", val_loader)]:
        model.train(phase == "train")
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            if phase == "train":
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    epoch += 1
