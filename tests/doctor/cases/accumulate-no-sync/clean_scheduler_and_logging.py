"""Steps every batch; only the scheduler and the logging are periodic: no accumulation here."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)
for i in range(100):
    loss = model(torch.randn(8, 4)).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if i % 10 == 0:
        scheduler.step()
        print(loss.item())
