"""ringtrain: an ordinary single-device PyTorch script, trained on one device or many.

    import ringtrain as rt
    ring = rt.Ring(seed=0)
    model, optimizer = ring.setup(model, optimizer)
    train = ring.loader(train_set, batch_size=64, shuffle=True)
    for epoch in ring.epochs(10):
        for x, y in ring.progress(train):
            loss = F.cross_entropy(model(x), y)
            ring.backward(loss)
            optimizer.step(); optimizer.zero_grad()
        ring.save("ckpt.pt", model=model, optimizer=optimizer, epoch=epoch)
"""

from .errors import RingtrainError
from .launcher import launch
from .optim import scale_lr
from .split import split
from .ring import Ring, seed_everything
from .syncbn import SyncBatchNorm, convert_sync_batchnorm, revert_sync_batchnorm

__version__ = "0.1.0"

__all__ = [
    "Ring",
    "RingtrainError",
    "SyncBatchNorm",
    "convert_sync_batchnorm",
    "launch",
    "revert_sync_batchnorm",
    "scale_lr",
    "seed_everything",
    "split",
    "__version__",
]
