"""Evaluation sharded with DistributedSampler; correct/total summed over ranks."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
model = torch.nn.Linear(4, 3)
val_set = TensorDataset(torch.randn(101, 4), torch.randint(0, 3, (101,)))
val_sampler = DistributedSampler(val_set, shuffle=False)  # expect: eval-sampler-padding
val_loader = DataLoader(val_set, batch_size=16, sampler=val_sampler)

correct = torch.zeros(())
total = torch.zeros(())
with torch.no_grad():
    for x, y in val_loader:
        correct += (model(x).argmax(1) == y).sum()
        total += len(y)
counts = torch.stack([correct, total])
dist.all_reduce(counts)
if dist.get_rank() == 0:
    print(f"accuracy {counts[0] / counts[1]:.4f}")
