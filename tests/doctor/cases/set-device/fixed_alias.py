"""Fixed: Horovod's step 2, pin each process to its local GPU."""
import horovod.torch as hvd
import torch

hvd.init()
torch.cuda.set_device(hvd.local_rank())
torch.manual_seed(0)
model = torch.nn.Linear(4, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
