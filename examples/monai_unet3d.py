"""MONAI's 3D U-Net tutorial (seed 003) trained through ringtrain: DDP by default, Horovod-style with --horovod.

Needs the extra: ``pip install -e ".[monai]"`` (monai, nibabel).

Launch:
    python examples/monai_unet3d.py                                            # one process
    ringtrain run --nproc-per-node 2 examples/monai_unet3d.py                  # DDP on 2 processes
    ringtrain run --horovod -np 2 python examples/monai_unet3d.py --horovod    # as horovodrun starts MONAI's
                                                                                 # unet_training_horovod.py

What MONAI's tutorials (unet_training_ddp.py / unet_training_horovod.py) do, kept: synthetic
volumes from ``create_test_image_3d`` written as NIfTI with nibabel, ``LoadImaged`` ...
``RandCropByPosNegLabeld(num_samples=...)`` on a MONAI ``Dataset``, ``monai.networks.nets.UNet
(spatial_dims=3)``, ``DiceLoss(sigmoid=True)``, Adam. What ringtrain replaces: init_process_group /
hvd.init, the DistributedSampler and its set_epoch, the DDP wrap or hvd.DistributedOptimizer and
its broadcasts, rank-0 saving, and the --local_rank argument. Sizes are small (32^3 volumes) so
one epoch takes seconds on a CPU; pass --size 128 --crop 96 for the tutorial's.

The tutorials generate the data inside the training processes: rank 0 writes while the other
ranks list the folder, and can find it empty or half written. Here each node's first process
writes into a temporary folder renamed into place in one step, and every rank waits at a
barrier before listing it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from glob import glob

import nibabel as nib
import numpy as np
import torch

import monai
from monai.data import Dataset, create_test_image_3d, list_data_collate
from monai.data.utils import worker_init_fn
from monai.transforms import (
    Compose, EnsureChannelFirstd, EnsureTyped, LoadImaged, RandCropByPosNegLabeld, RandRotate90d, ScaleIntensityd,
)

import ringtrain as rt


def write_volumes(folder: str, count: int, size: int) -> None:
    """``count`` image/segmentation pairs as NIfTI files, the same on every node (seeded)."""
    if os.path.isdir(folder):
        return
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".monai-data-", dir=parent)
    rng = np.random.RandomState(0)
    radius = max(2, size // 6)
    for i in range(count):
        im, seg = create_test_image_3d(size, size, size, num_objs=4, rad_max=radius, rad_min=max(1, radius // 2),
                                       noise_max=0.2, num_seg_classes=1, channel_dim=-1, random_state=rng)
        nib.save(nib.Nifti1Image(im, np.eye(4)), os.path.join(scratch, f"img{i:03d}.nii.gz"))
        nib.save(nib.Nifti1Image(seg, np.eye(4)), os.path.join(scratch, f"seg{i:03d}.nii.gz"))
    try:
        os.rename(scratch, folder)  # atomic: other ranks (or nodes on a shared disk) see all or nothing
    except OSError:  # another node renamed its identical copy first
        shutil.rmtree(scratch, ignore_errors=True)


def dice(model, loader, ring) -> float:
    """Mean Dice over the held-out volumes (each evaluated on exactly one rank, whole)."""
    metric = monai.metrics.DiceMetric(include_background=True, reduction="sum")
    model.eval()
    with torch.no_grad():
        for batch in loader:
            pred = (torch.sigmoid(model(batch["img"])) > 0.5).float()
            metric(y_pred=pred, y=batch["seg"])
    model.train()
    total, count = metric.aggregate().item() if len(metric) else 0.0, len(metric)
    return ring.all_reduce(total, op="sum").item() / ring.all_reduce(count, op="sum").item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-d", "--dir", default="./monai_data", help="folder of the synthetic volumes")
    parser.add_argument("--horovod", action="store_true", help="Horovod-style: the optimizer averages gradients")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--volumes", type=int, default=16, help="training volumes (4 more are held out)")
    parser.add_argument("--size", type=int, default=32, help="volume side")
    parser.add_argument("--crop", type=int, default=16, help="side of the random training crops")
    parser.add_argument("--samples", type=int, default=4, help="crops per volume (RandCropByPosNegLabeld)")
    parser.add_argument("--batch-size", type=int, default=2, help="volumes per process per step")
    parser.add_argument("--lr", type=float, default=3e-2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    ring = rt.Ring(strategy="hvd" if args.horovod else "ddp", seed=args.seed)
    if ring.is_local_main:  # one writer per node; the others wait at the barrier
        write_volumes(args.dir, args.volumes + 4, args.size)
    ring.barrier()
    images = sorted(glob(os.path.join(args.dir, "img*.nii.gz")))
    segs = sorted(glob(os.path.join(args.dir, "seg*.nii.gz")))
    files = [{"img": img, "seg": seg} for img, seg in zip(images, segs)]
    train_files, val_files = files[:-4], files[-4:]

    load = [LoadImaged(keys=["img", "seg"]), EnsureChannelFirstd(keys=["img", "seg"], channel_dim=-1),
            ScaleIntensityd(keys="img")]
    crop = args.crop
    train_transforms = Compose([
        *load,
        RandCropByPosNegLabeld(keys=["img", "seg"], label_key="seg", spatial_size=[crop, crop, crop], pos=1, neg=1,
                               num_samples=args.samples),
        RandRotate90d(keys=["img", "seg"], prob=0.5, spatial_axes=[0, 2]),
        EnsureTyped(keys=["img", "seg"]),
    ])
    # MONAI's random transforms carry their own RandomState: one stream per rank, as
    # monai.data.DataLoader gives one per worker (worker_init_fn below, with num_workers > 0).
    train_transforms.set_random_state(seed=args.seed * 1000 + ring.rank)
    train_ds = Dataset(data=train_files, transform=train_transforms)
    val_ds = Dataset(data=val_files, transform=Compose([*load, EnsureTyped(keys=["img", "seg"])]))
    # Each volume yields `samples` crops: list_data_collate (monai.data.DataLoader's default) flattens
    # them into one batch of batch_size x samples; ring.loader keeps the collate_fn it is given.
    train = ring.loader(train_ds, batch_size=args.batch_size, shuffle=True, collate_fn=list_data_collate,
                        worker_init_fn=worker_init_fn)
    val = ring.loader(val_ds, batch_size=1, exact=True)

    torch.manual_seed(args.seed)  # the same initial weights on every rank (setup broadcasts rank 0's anyway)
    model = monai.networks.nets.UNet(spatial_dims=3, in_channels=1, out_channels=1, channels=(8, 16, 32),
                                     strides=(2, 2), num_res_units=1)
    loss_function = monai.losses.DiceLoss(sigmoid=True)
    optimizer = torch.optim.Adam(model.parameters(), args.lr)
    model, optimizer = ring.setup(model, optimizer)

    ring.print(f"{ring.world_size} process(es), {'hvd' if args.horovod else 'ddp'}; "
               f"{len(train_ds)} training / {len(val_ds)} held-out volumes of {args.size}^3")
    ring.print(f"held-out dice before training {dice(model, val, ring):.4f}")
    for epoch in ring.epochs(args.epochs):
        losses, start = [], time.perf_counter()
        for batch in train:
            loss = loss_function(model(batch["img"]), batch["seg"])
            ring.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        seconds = time.perf_counter() - start
        mean_loss = ring.all_reduce(sum(losses) / len(losses)).item()
        ring.print(f"epoch {epoch + 1}/{args.epochs} ({seconds:.1f} s) loss {mean_loss:.4f} "
                   f"held-out dice {dice(model, val, ring):.4f}")
    ring.save("monai_unet3d.pt", model=model, optimizer=optimizer, epoch=epoch)


if __name__ == "__main__":
    main()
