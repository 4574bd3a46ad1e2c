"""Seed 003's complete MONAI DataParallel script ("如果需要跑来看看效果"): one process drives the GPUs
named in CUDA_VISIBLE_DEVICES, ``model = torch.nn.DataParallel(model)``.

Sizes are small for a CPU (marked); everything else is the seed's. Started as the seed does:
    python seed003_monai_dp.py -d ./testdata
"""

import argparse
import os
from glob import glob

import nibabel as nib
import numpy as np
import torch

import monai
from monai.data import DataLoader, Dataset, create_test_image_3d
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

VOLUMES, SIZE, CROP, EPOCHS = 8, 32, 16, 5  # the seed: 200 volumes of 128^3, crops of 96^3, 5 epochs


def train(args):
    if not os.path.exists(args.dir):
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
    # DataParallel: the batch is the global one, cut over the GPUs
    train_loader = DataLoader(
        train_ds,
        batch_size=2,  # the seed: 10
        shuffle=False,
        num_workers=2,
        pin_memory=torch.cuda.is_available(),  # CPU: nothing to pin for (the seed: True)
    )

    # create UNet, DiceLoss and Adam optimizer
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = monai.networks.nets.UNet(
        spatial_dims=3,
        in_channels=1,
        out_channels=1,
        channels=(4, 8, 16),  # the seed: (16, 32, 64, 128, 256)
        strides=(2, 2),  # the seed: (2, 2, 2, 2)
        num_res_units=2,
    ).to(device)
    model = torch.nn.DataParallel(model)
    loss_function = monai.losses.DiceLoss(sigmoid=True).to(device)
    optimizer = torch.optim.Adam(model.parameters(), 1e-2)  # the seed: 1e-3, for its 200 volumes

    # start a typical PyTorch training
    epoch_loss_values = list()
    for epoch in range(EPOCHS):
        print("-" * 10)
        print(f"epoch {epoch + 1}/{EPOCHS}")
        model.train()
        epoch_loss = 0
        step = 0
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
    torch.save(model.state_dict(), "final_model.pth")
    _toy.report(model, epoch_loss_values)  # test hook


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-d", "--dir", default="./testdata", type=str, help="directory to create random data")
    args = parser.parse_args()

    train(args=args)


if __name__ == "__main__":
    os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
    main()
