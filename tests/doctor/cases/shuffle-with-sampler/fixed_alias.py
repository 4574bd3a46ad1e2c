"""Fixed: shuffle only when there is no sampler."""
import monai
import torch
import torch.utils.data as tud

distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
dataset = tud.TensorDataset(torch.randn(64, 4))
sampler = tud.distributed.DistributedSampler(dataset) if distributed else None
loader = tud.DataLoader(dataset, 16, sampler is None, sampler)
volumes = monai.data.DataLoader(
    dataset,
    batch_size=2,
    shuffle=(sampler is None),
    sampler=sampler,
)
