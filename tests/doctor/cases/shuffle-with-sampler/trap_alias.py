"""Positional arguments, a sampler that exists only when distributed, a MONAI loader."""
import monai
import torch
import torch.utils.data as tud

distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
dataset = tud.TensorDataset(torch.randn(64, 4))
sampler = tud.distributed.DistributedSampler(dataset) if distributed else None
loader = tud.DataLoader(dataset, 16, True, sampler)  # expect: shuffle-with-sampler
volumes = monai.data.DataLoader(  # expect: shuffle-with-sampler
    dataset,
    batch_size=2,
    shuffle=True,
    sampler=sampler,
)
