"""`from torch import save`, a helper called under a guard that is not about ranks."""
import argparse
import os

import torch
from torch import distributed, nn, save
from torch.nn.parallel import DistributedDataParallel


def save_checkpoint(state, folder, name="last.pt"):
    os.makedirs(folder, exist_ok=True)
    save(state, os.path.join(folder, name))  # expect: save-every-rank


class Trainer:
    def __init__(self, model, out):
        self.model = DistributedDataParallel(model)
        self.out = out

    def fit(self, epochs):
        for epoch in range(epochs):
            if epoch % 5 == 0:
                save_checkpoint({"model": self.model.module.state_dict(), "epoch": epoch}, self.out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs")
    args = parser.parse_args()
    distributed.init_process_group("gloo")
    Trainer(nn.Linear(4, 2), args.out).fit(10)
