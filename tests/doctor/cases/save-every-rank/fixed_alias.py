"""Fixed: the helper returns early off the main process; per-rank files are deliberate."""
import argparse
import os

import torch
from torch import distributed, nn, save
from torch.nn.parallel import DistributedDataParallel


def is_main_process():
    return distributed.get_rank() == 0


def save_checkpoint(state, folder, name="last.pt"):
    if not is_main_process():
        return
    os.makedirs(folder, exist_ok=True)
    save(state, os.path.join(folder, name))


class Trainer:
    def __init__(self, model, out):
        self.model = DistributedDataParallel(model)
        self.out = out
        self.rank = distributed.get_rank()

    def fit(self, epochs):
        for epoch in range(epochs):
            if epoch % 5 == 0:
                save_checkpoint({"model": self.model.module.state_dict(), "epoch": epoch}, self.out)
                # each rank keeps its own RNG state, in its own file, on purpose
                save(torch.get_rng_state(), os.path.join(self.out, f"rng_rank{self.rank}.pt"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs")
    args = parser.parse_args()
    distributed.init_process_group("gloo")
    Trainer(nn.Linear(4, 2), args.out).fit(10)
