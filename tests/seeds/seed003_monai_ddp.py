"""Seed 003's complete MONAI DDP script (MONAI's tutorial unet_training_ddp.py): a 3D UNet on
synthetic NIfTI volumes, with the seed's 8 steps -- init_process_group, a MONAI
DistributedSampler (even_divisible, shuffle), the device from --local_rank, DDP,
set_epoch every epoch, saving on rank 0 only, and ``--local_rank`` parsed in main().

Sizes are small for a CPU (marked); everything else is the seed's. Started as the seed does:
    python -m torch.distributed.launch --nproc_per_node=2 train.py -d ./testdata
    ->  ringtrain run --nproc_per_node=2 seed003_monai_ddp.py -d ./testdata
"""

import argparse
import os
import sys
from glob import glob

import nibabel as nib
import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import monai
from monai.data import DataLoader, Dataset, DistributedSampler, create_test_image_3d
from monai.transforms import (
    Compose,
    EnsureChannelFirstd,
    EnsureTyped,
    LoadImaged,
    RandCropByPosNegLabeld,
    RandRotate90d,
    ScaleIntensityd,
)

import _toy

VOLUMES, SIZE, CROP, EPOCHS = 8, 32, 16, 5  # the seed: 100 volumes of 128^3, crops of 96^3, 5 epochs


def train(args):
    # disable logging for processes except 0 on every node
    if args.local_rank != 0:
        f = open(os.devnull, "w")
        sys.stdout = sys.stderr = f
    elif not os.path.exists(args.dir):
        # create random image, mask pairs for training
        print(f"generating synthetic data to {args.dir} (this may take a while)")
        os.makedirs(args.dir)
        # set random seed to generate same random data for every node
        np.random.seed(seed=0)
        for i in range(VOLUMES):
            # rad_max: spheres that fit a small volume (the default, 30, needs 64^3 and up)
            im, seg = create_test_image_3d(SIZE, SIZE, SIZE, rad_max=10, num_seg_classes=1, channel_dim=-1)
            n = nib.Nifti1Image(im, np.eye(4))
            nib.save(n, os.path.join(args.dir, f"img{i:d}.nii.gz"))
            n = nib.Nifti1Image(seg, np.eye(4))
            nib.save(n, os.path.join(args.dir, f"seg{i:d}.nii.gz"))

    # initialize the distributed training process, every GPU runs in a process
    dist.init_process_group(backend="gloo", init_method="env://")  # CPU: gloo (the seed: nccl)

    images = sorted(glob(os.path.join(args.dir, "img*.nii.gz")))
    segs = sorted(glob(os.path.join(args.dir, "seg*.nii.gz")))
    train_files = [{"img": img, "seg": seg} for img, seg in zip(images, segs)]

    # define transforms for image and segmentation
    train_transforms = Compose(
        [
            LoadImaged(keys=["img", "seg"]),
            # the seed: AsChannelFirstd(keys=..., channel_dim=-1), which current MONAI no longer has
            EnsureChannelFirstd(keys=["img", "seg"], channel_dim=-1),
            ScaleIntensityd(keys="img"),
            RandCropByPosNegLabeld(
                keys=["img", "seg"], label_key="seg", spatial_size=[CROP] * 3, pos=1, neg=1, num_samples=4
            ),
            RandRotate90d(keys=["img", "seg"], prob=0.5, spatial_axes=[0, 2]),
            EnsureTyped(keys=["img", "seg"]),
        ]
    )

    # create a training data loader
    train_ds = Dataset(data=train_files, transform=train_transforms)
    # create a training data sampler
    train_sampler = DistributedSampler(dataset=train_ds, even_divisible=True, shuffle=True)
    # batch_size=2 images, cropped 4 times each by RandCropByPosNegLabeld: 2 x 4 volumes per step
    train_loader = DataLoader(
        train_ds,
        batch_size=2,  # the seed: 10
        shuffle=False,
        num_workers=2,
        pin_memory=torch.cuda.is_available(),  # CPU: nothing to pin for (the seed: True)
        sampler=train_sampler,
    )

    # create UNet, DiceLoss and Adam optimizer
    if torch.cuda.is_available():  # CPU: no GPU to pin; the seed: cuda:{local_rank}
        device = torch.device(f"cuda:{args.local_rank}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    model = monai.networks.nets.UNet(
        spatial_dims=3,
        in_channels=1,
        out_channels=1,
        channels=(4, 8, 16),  # the seed: (16, 32, 64, 128, 256)
        strides=(2, 2),  # the seed: (2, 2, 2, 2)
        num_res_units=2,
    ).to(device)
    loss_function = monai.losses.DiceLoss(sigmoid=True).to(device)
    optimizer = torch.optim.Adam(model.parameters(), 1e-2)  # the seed: 1e-3, for its 100 volumes
    # wrap the model with DistributedDataParallel module
    model = DistributedDataParallel(model)  # CPU: no device_ids/output_device (they name a GPU)

    # start a typical PyTorch training
    epoch_loss_values = list()
    for epoch in range(EPOCHS):
        print("-" * 10)
        print(f"epoch {epoch + 1}/{EPOCHS}")
        model.train()
        epoch_loss = 0
        step = 0
        train_sampler.set_epoch(epoch)
        for batch_data in train_loader:
            step += 1
            inputs, labels = batch_data["img"].to(device), batch_data["seg"].to(device)
            optimizer.zero_grad()
            outputs = model(inputs)
            loss = loss_function(outputs, labels)
            loss.backward()
            optimizer.step()
            epoch_loss += loss.item()
            epoch_len = len(train_ds) // train_loader.batch_size
            print(f"{step}/{epoch_len}, train_loss: {loss.item():.4f}")
        epoch_loss /= step
        epoch_loss_values.append(epoch_loss)
        print(f"epoch {epoch + 1} average loss: {epoch_loss:.4f}")
    print(f"train completed, epoch losses: {epoch_loss_values}")
    if dist.get_rank() == 0:
        # all processes should see same parameters as they all start from same
        # random parameters and gradients are synchronized in backward passes,
        # therefore, saving it in one process is sufficient
        torch.save(model.state_dict(), "final_model.pth")
    _toy.report(model, epoch_loss_values, dist.get_rank())  # test hook
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-d", "--dir", default="./testdata", type=str, help="directory to create random data")
    # must parse the command-line argument: ``--local_rank=LOCAL_PROCESS_RANK``, which will be provided by DDP
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()

    train(args=args)


if __name__ == "__main__":
    main()
