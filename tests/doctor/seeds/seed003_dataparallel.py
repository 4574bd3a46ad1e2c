"""Seed 003's DataParallel script (MONAI UNet), shortened: batch_size=10 is split over the GPUs."""
import monai
import torch
from monai.data import DataLoader, Dataset

train_ds = Dataset(data=[{"img": i} for i in range(200)])
train_loader = DataLoader(train_ds, batch_size=10, shuffle=False, num_workers=2, pin_memory=True)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = monai.networks.nets.UNet(spatial_dims=3, in_channels=1, out_channels=1,
                                 channels=(16, 32, 64, 128, 256), strides=(2, 2, 2, 2)).to(device)
model = torch.nn.DataParallel(model)  # expect: dataparallel-batch
optimizer = torch.optim.Adam(model.parameters(), 1e-3)
for epoch in range(5):
    for batch_data in train_loader:
        optimizer.zero_grad()
        loss = model(batch_data["img"].to(device)).mean()
        loss.backward()
        optimizer.step()
torch.save(model.state_dict(), "final_model.pth")
