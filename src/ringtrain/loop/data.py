"""Loaders that shard, reshuffle and land on the device without being asked.

``make_loader`` builds an ordinary ``torch.utils.data.DataLoader`` with the right
sampler for this rank and wraps it in ``RingLoader``, which

* sets the sampler's epoch on every pass (the forgotten ``set_epoch`` trap):
  ``ring.epochs`` sets it explicitly, and a loader iterated without it still
  advances one epoch per pass;
* moves every batch to the ring's device (pinned memory + ``non_blocking`` on CUDA);
* counts the batches it delivered, so a checkpoint can resume mid-epoch.

Training loaders use ``DistributedSampler`` — its padding rules, and the same
global order for any world size (rank r takes every W-th index of one seeded
permutation), which is why N ranks x batch b see exactly the samples one process
x batch N*b sees. Evaluation loaders (``exact=True``) use ``ExactSampler``:
contiguous, unpadded blocks, so every sample is evaluated once and gathering
per-rank results in rank order restores dataset order.
"""

from __future__ import annotations

import copy
import functools
import random
from collections.abc import Mapping, MutableMapping
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, Sampler

from ..errors import RingtrainError
from ..liveness.activity import Activity

_END = object()


class ExactSampler(Sampler[int]):
    """Contiguous shard of ``range(n)`` for this rank: no padding, no drops.

    Rank r gets ``[start_r, end_r)`` with sizes differing by at most one, so
    ``all_gather`` of per-sample results concatenates back into dataset order.
    With ``shuffle`` the blocks are cut from one seeded permutation per epoch.
    """

    def __init__(self, n: int, num_replicas: int, rank: int, shuffle: bool = False, seed: int = 0):
        self.n, self.num_replicas, self.rank = n, num_replicas, rank
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        base, extra = divmod(n, num_replicas)
        self.start = rank * base + min(rank, extra)
        self.end = self.start + base + (1 if rank < extra else 0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.end - self.start

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=g)[self.start : self.end].tolist()
        else:
            order = range(self.start, self.end)
        return iter(order)


class ShardedSampler(Sampler[int]):
    """A user's sampler, sharded across ranks with DistributedSampler's rules.

    Every rank draws the user's full index sequence under the same RNG seed
    (seed + epoch), so all ranks agree on it, then takes every W-th index,
    padding by wrap-around so each rank has the same number of samples.
    """

    def __init__(self, sampler: Sampler, num_replicas: int, rank: int, seed: int = 0, drop_last: bool = False):
        self.sampler, self.num_replicas, self.rank = sampler, num_replicas, rank
        self.seed, self.drop_last, self.epoch = seed, drop_last, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def _per_rank(self, total: int) -> int:
        if self.drop_last:
            return total // self.num_replicas
        return -(-total // self.num_replicas)

    def __len__(self) -> int:
        return self._per_rank(len(self.sampler))

    def __iter__(self) -> Iterator[int]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + self.epoch)
            indices = list(iter(self.sampler))
        per_rank = self._per_rank(len(indices))
        total = per_rank * self.num_replicas
        if total > len(indices):
            indices += (indices * (total // max(len(indices), 1) + 1))[: total - len(indices)]
        return iter(indices[:total][self.rank :: self.num_replicas])


class _Skip(Sampler[int]):
    """Resume mid-epoch: the inner sampler's order with what was already trained left out.

    ``skip``: the first indices of this rank's shard (same world size as the saved run).
    ``global_skip``: after a change of world size, the first P positions of the epoch's
    *global* order are left out and the rest is sharded across the new ranks the way
    DistributedSampler shards (padding by wrap-around), so no sample of the epoch is
    skipped or repeated. Only for the DistributedSampler ring.loader makes.
    """

    def __init__(self, inner: Sampler):
        self.inner, self.skip, self.global_skip = inner, 0, 0

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)

    def _resharded(self) -> list[int]:
        ds = self.inner
        n = len(ds.dataset)  # type: ignore[attr-defined]
        if ds.shuffle:  # type: ignore[attr-defined]
            # DistributedSampler's own order for this epoch (torch/utils/data/distributed.py).
            g = torch.Generator()
            g.manual_seed(ds.seed + ds.epoch)  # type: ignore[attr-defined]
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        rest, world = order[self.global_skip :], ds.num_replicas  # type: ignore[attr-defined]
        if ds.drop_last:  # type: ignore[attr-defined]
            rest = rest[: len(rest) - len(rest) % world]
        elif rest and len(rest) % world:
            rest += (rest * world)[: world - len(rest) % world]
        return rest[ds.rank :: world]  # type: ignore[attr-defined]

    def __len__(self) -> int:
        if self.global_skip:
            return len(self._resharded())
        return max(len(self.inner) - self.skip, 0)

    def __iter__(self) -> Iterator[int]:
        if self.global_skip:
            return iter(self._resharded())
        it = iter(self.inner)
        for _ in range(self.skip):
            next(it, None)
        return it


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Tensors anywhere inside tuples, lists, dicts and namedtuples, moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        moved = {k: move_to_device(v, device, non_blocking) for k, v in batch.items()}
        if isinstance(batch, MutableMapping):
            # A shallow copy, then the moved values: keeps the type and what its constructor
            # would not take back (a defaultdict's default_factory, an OrderedDict's order),
            # as torch's pin_memory does. type(batch)(moved) would call defaultdict(dict).
            try:
                out = copy.copy(batch)
                out.update(moved)
                return out
            except Exception:  # an exotic mapping that cannot be copied: a plain dict of the same items
                return moved
        try:
            return type(batch)(moved)
        except Exception:
            return moved
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(move_to_device(v, device, non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(v, device, non_blocking) for v in batch)
    return batch


class ShardedStream(IterableDataset):
    """An ``IterableDataset`` read by one rank of many: item i of the stream goes to the rank (and DataLoader
    worker) ``i mod (ranks x workers)`` — every item to exactly one of them, the same split on every pass.

    A resumed pass skips this reader's first ``skip_batches`` batches (``RingLoader.resume``): exact when the
    stream gives the same items in the same order for the same epoch (``set_epoch`` is passed on to it)."""

    def __init__(self, inner: IterableDataset, num_replicas: int, rank: int, batch_size: int):
        self.inner, self.num_replicas, self.rank, self.batch_size = inner, num_replicas, rank, batch_size
        self.skip_batches = 0

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        # Read now, not at the first item: the ring loader clears skip_batches once its iterator exists.
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        readers, me = self.num_replicas * workers, self.rank * workers + worker
        # DataLoader takes batches from its workers in turn: this worker made every workers-th of the skipped ones.
        skip = len(range(worker, self.skip_batches, workers)) * self.batch_size
        self.skip_batches = 0  # a persistent worker's copy skips only once
        return self._items(readers, me, skip)

    def _items(self, readers: int, me: int, skip: int) -> Iterator[Any]:
        for i, item in enumerate(self.inner):
            if i % readers != me:
                continue
            if skip:
                skip -= 1
                continue
            yield item


class RingLoader:
    """A DataLoader that sets its epoch, moves batches to the device and counts them."""

    def __init__(self, loader: DataLoader, device: torch.device, exact: bool, activity: Activity | None = None):
        self.loader = loader
        self.activity = Activity() if activity is None else activity  # the ring's: what the watchdog reads
        self.device = device
        self.exact = exact
        self._skip = loader.sampler if isinstance(loader.sampler, _Skip) else None
        self._stream = loader.dataset if isinstance(loader.dataset, ShardedStream) else None
        self._non_blocking = device.type == "cuda"
        self._next_epoch = 0
        self.epoch = 0
        self.batches_seen = 0  # in the current pass, counting resumed-over batches
        self.finished = False
        self._resumed_batches = 0
        self.per_device_batch = loader.batch_size  # the ring sets it when one process drives several devices
        self.pass_length = 0  # batches in the current pass, resumed-over ones included
        # Called with this loader before each batch is handed out, when everything done
        # with the previous batch is finished: the ring's accumulation window needs to
        # know when an epoch is about to end, and a periodic checkpoint is taken there.
        self.listener: Callable[["RingLoader"], None] | None = None

    def remaining(self) -> int | None:
        """Batches left in the current pass, the next one included (None: a stream)."""
        return self.pass_length - self.batches_seen if self.pass_length >= 0 else None

    # The DataLoader's public face, for code that inspects it.
    @property
    def dataset(self) -> Dataset:
        return self.loader.dataset

    @property
    def batch_size(self) -> int | None:
        return self.loader.batch_size

    @property
    def sampler(self) -> Sampler:
        return self._skip.inner if self._skip is not None else self.loader.sampler

    def set_epoch(self, epoch: int) -> None:
        self._next_epoch = epoch

    def resume(self, epoch: int, batches: int, position: int | None = None) -> None:
        """Make the next pass epoch ``epoch``, starting after its first ``batches`` batches.

        ``position`` (samples of the epoch already trained by all ranks together) is given
        when the world size changed: the rest of the epoch is re-sharded from there.
        """
        self._next_epoch = epoch
        if self._stream is not None and batches:
            self._stream.skip_batches = batches
            self._resumed_batches = batches
            return
        if self._skip is None or not self.loader.batch_size or not batches:
            return
        if position is not None and isinstance(self._skip.inner, DistributedSampler):
            self._skip.global_skip = position
        else:
            self._skip.skip = batches * self.loader.batch_size
        self._resumed_batches = 0 if position is not None else batches

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        self.epoch = self._next_epoch
        self._next_epoch += 1
        sampler = self.sampler
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.epoch)
        if self._stream is not None:
            self._stream.set_epoch(self.epoch)
        self.batches_seen = self._resumed_batches
        try:
            self.pass_length = len(self.loader) + self._resumed_batches
        except TypeError:  # an IterableDataset without __len__
            self.pass_length = -1
        self.finished = False
        # What the watchdog reads (activity.py): a training loader's fetch is the step's data wait.
        phase, after = ("evaluation", "evaluation") if self.exact else ("data", "forward")
        batches = iter(self.loader)
        if self._stream is not None:
            self._stream.skip_batches = 0  # the iterator (and its workers' copies) took it
        try:
            while True:
                if not self.exact:
                    self.activity.step_begins()
                left = self.remaining()
                if self.listener is not None and (left is None or left > 0):
                    # Before the fetch: a dataset that draws random numbers (augmentation) in this process does
                    # so after a checkpoint written here, as a resumed run does.
                    self.listener(self)
                with self.activity.timed(phase, None if self.exact else "data"):  # an evaluation's fetch: no step's
                    batch = next(batches, _END)
                if batch is _END:
                    if not self.exact:
                        self.activity.pass_ends()  # until the next step, time is no step's (evaluation, saving)
                    break
                self.activity.enter(after)
                self.batches_seen += 1
                yield move_to_device(batch, self.device, self._non_blocking) if self.device.type != "cpu" else batch
            self.finished = True
        finally:
            # A resume skips only in the pass it was made for.
            if self._skip is not None:
                self._skip.skip = self._skip.global_skip = 0
            self._resumed_batches = 0

    def state(self) -> dict[str, int | bool]:
        replicas = getattr(self.sampler, "num_replicas", 1)
        return {
            "epoch": self.epoch,
            "batches": self.batches_seen,
            "finished": self.finished,
            "exact": self.exact,
            "replicas": replicas,
            # Samples of this epoch trained by all ranks together (a resume on another world size needs it).
            "position": self.batches_seen * (self.loader.batch_size or 0) * replicas,
        }


def _init_worker(user_init: Callable[[int], None] | None, worker_id: int) -> None:
    # DataLoader gives each worker torch seed base+worker_id; numpy and random
    # are not seeded by torch and would repeat across workers without this.
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
    if user_init is not None:
        user_init(worker_id)


def _seed_worker(user_init: Callable[[int], None] | None) -> Callable[[int], None]:
    # A partial of a module-level function, not a closure: workers started by spawn or forkserver (macOS's
    # default, Python 3.14's on Linux) receive it pickled.
    return functools.partial(_init_worker, user_init)


def make_loader(
    dataset: Dataset,
    *,
    batch_size: int,
    shuffle: bool,
    drop_last: bool,
    exact: bool,
    rank: int,
    world_size: int,
    seed: int,
    device: torch.device,
    activity: Activity | None = None,
    **kwargs: Any,
) -> RingLoader:
    """The DataLoader for this rank; see the module docstring for the sharding rules."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise RingtrainError(
            f"ring.loader got batch_size={batch_size!r}",
            "batch_size is the number of samples per device per step: pass a positive integer.",
        )
    if "batch_sampler" in kwargs and kwargs["batch_sampler"] is not None:
        raise RingtrainError(
            "ring.loader got a batch_sampler, which cannot be sharded across ranks",
            "pass sampler=... and batch_size=... instead, or build the DataLoader yourself and shard by ring.rank.",
        )
    user_sampler = kwargs.pop("sampler", None)
    if user_sampler is not None and shuffle:
        raise RingtrainError(
            "ring.loader got both sampler=... and shuffle=True",
            "drop shuffle=True: the sampler decides the order (it is sharded across ranks as given).",
        )

    iterable = isinstance(dataset, IterableDataset)
    if iterable:
        if exact:
            raise RingtrainError(
                "exact=True needs a map-style dataset (with __len__ and __getitem__)",
                "shard the stream yourself by ring.rank and ring.world_size, and drop exact=True.",
            )
        if user_sampler is not None or shuffle:
            raise RingtrainError(
                f"ring.loader got an IterableDataset with {'sampler=...' if user_sampler is not None else 'shuffle=True'}: "
                "a stream has no indices to sample or shuffle",
                "drop it (shuffle inside the stream, e.g. per its set_epoch), or give a map-style dataset.")
        # Each rank (and each of its DataLoader workers) reads its own share of the stream (ShardedStream).
        dataset = ShardedStream(dataset, world_size, rank, batch_size)
        sampler = None
    else:
        n = len(dataset)  # type: ignore[arg-type]
        if n < world_size:
            raise RingtrainError(
                f"the dataset has {n} sample(s), fewer than the {world_size} ranks it is split across",
                "use a larger dataset or fewer processes (--nproc-per-node).",
            )
        if exact:
            if user_sampler is not None:
                raise RingtrainError(
                    "exact=True builds its own duplicate-free sampler and cannot take sampler=...",
                    "drop sampler=..., or drop exact=True.",
                )
            sampler = ExactSampler(n, world_size, rank, shuffle=shuffle, seed=seed)
        elif user_sampler is None:
            sampler = DistributedSampler(
                dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
            )
        elif isinstance(user_sampler, DistributedSampler):
            if (user_sampler.num_replicas, user_sampler.rank) != (world_size, rank):
                raise RingtrainError(
                    f"the DistributedSampler given has num_replicas={user_sampler.num_replicas}, "
                    f"rank={user_sampler.rank}, but this process is rank {rank} of {world_size}",
                    "let ring.loader make the sampler (drop sampler=...), or pass "
                    "num_replicas=ring.world_size, rank=ring.rank.",
                )
            sampler = user_sampler
        elif world_size == 1:
            sampler = user_sampler
        else:
            sampler = ShardedSampler(user_sampler, world_size, rank, seed=seed, drop_last=drop_last)
        sampler = _Skip(sampler)

    generator = torch.Generator()
    # Distinct random streams per rank (and, via DataLoader, per worker).
    generator.manual_seed(seed * 1000 + rank)
    kwargs.setdefault("pin_memory", device.type == "cuda")
    kwargs["worker_init_fn"] = _seed_worker(kwargs.get("worker_init_fn"))
    kwargs.setdefault("generator", generator)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last, **kwargs)
    return RingLoader(loader, device, exact, activity)

