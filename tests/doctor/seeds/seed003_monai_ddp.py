"""Seed 003 (MONAI, DP and DDP): the DDP script it gives in full, shortened to its skeleton.

Everything it teaches is right here — set_epoch, to(device) before the wrap, set_device,
the rank-0 save — except the --local_rank argument of the old launcher.
"""
import argparse
import os
import sys

import monai
import torch
import torch.distributed as dist
from monai.data import DataLoader, Dataset, DistributedSampler
from torch.nn.parallel import DistributedDataParallel


def train(args):
    if args.local_rank != 0:
        f = open(os.devnull, "w")
        sys.stdout = sys.stderr = f
    dist.init_process_group(backend="nccl", init_method="env://")
    train_ds = Dataset(data=[{"img": i} for i in range(100)])
    train_sampler = DistributedSampler(dataset=train_ds, even_divisible=True, shuffle=True)
    train_loader = DataLoader(train_ds, batch_size=10, shuffle=False, num_workers=2, pin_memory=True,
                              sampler=train_sampler)
    device = torch.device(f"cuda:{args.local_rank}")
    torch.cuda.set_device(device)
    model = monai.networks.nets.UNet(spatial_dims=3, in_channels=1, out_channels=1,
                                     channels=(16, 32, 64, 128, 256), strides=(2, 2, 2, 2)).to(device)
    loss_function = monai.losses.DiceLoss(sigmoid=True).to(device)
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    model = DistributedDataParallel(model, device_ids=[device], output_device=[device])
    for epoch in range(5):
        model.train()
        train_sampler.set_epoch(epoch)
        for batch_data in train_loader:
            inputs, labels = batch_data["img"].to(device), batch_data["seg"].to(device)
            optimizer.zero_grad()
            loss = loss_function(model(inputs), labels)
            loss.backward()
            optimizer.step()
            print(f"train_loss: {loss.item():.4f}")
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), "final_model.pth")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-d", "--dir", default="./testdata", type=str)
    parser.add_argument("--local_rank", type=int, default=0)  # expect: local-rank-arg
    args = parser.parse_args()
    train(args=args)


if __name__ == "__main__":
    main()
