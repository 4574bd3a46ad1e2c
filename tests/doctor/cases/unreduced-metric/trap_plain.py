"""Each rank evaluates its shard and prints its own accuracy as the accuracy."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
model = torch.nn.Linear(4, 3)
test_set = TensorDataset(torch.randn(100, 4), torch.randint(0, 3, (100,)))
test_loader = DataLoader(test_set, batch_size=10, sampler=DistributedSampler(test_set, shuffle=False, drop_last=True))
correct = total = 0
for x, y in test_loader:
    correct += (model(x).argmax(1) == y).sum().item()
    total += len(y)
print(f"test accuracy {100.0 * correct / total:.2f}%")  # expect: unreduced-metric
