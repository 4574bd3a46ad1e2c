"""``ElasticSampler`` (horovod/torch/elastic/sampler.py): a sharding sampler that remembers progress.

Like ``DistributedSampler``, but it records how many samples the job has processed
this epoch (``record_batch``); after a reset, the remaining samples are re-sharded
over the current ranks so none is processed twice. Call ``set_epoch`` at the end
of each epoch (it clears the record).
"""

from __future__ import annotations

import math
import random

import torch.utils.data

from ..basics import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count one batch of ``batch_size`` samples per rank as processed."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices) -> None:
        self.processed_num += len(indices) * self.num_replicas

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        self.num_replicas = size()
        self.rank = rank()
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)  # the same order on every rank
        self.remaining_indices = indices[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = self.remaining_indices[:]
        indices += indices[:self.total_size - len(indices)]  # pad to an even split
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
