"""Loaders: sharding rules, exact evaluation, epochs, samplers and bad input."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset, WeightedRandomSampler

import _ring_jobs as jobs
import ringtrain as rt
from ringtrain.loop.data import ExactSampler, ShardedSampler, make_loader, move_to_device

pytestmark = pytest.mark.timeout(180)


def test_training_shards_follow_distributed_sampler_padding(run_ranks):
    n = 21  # not divisible by 2: one index is repeated as padding, like DistributedSampler
    r0, r1 = run_ranks(jobs.shards, n, True, False, 3)
    for epoch in range(3):
        a, b = r0[epoch], r1[epoch]
        assert len(a) == len(b) == math.ceil(n / 2)
        counts = Counter(a + b)
        assert set(counts) == set(range(n))
        assert sum(counts.values()) == 2 * math.ceil(n / 2)
        # exactly DistributedSampler's shards for this epoch and seed
        for rank, got in enumerate((a, b)):
            ref = DistributedSampler(range(n), num_replicas=2, rank=rank, shuffle=True, seed=3)
            ref.set_epoch(epoch)
            assert got == list(ref)
    assert r0[0] != r0[1] != r0[2], "order must change between epochs"


def test_exact_shards_cover_dataset_once(run_ranks):
    n = 21
    r0, r1 = run_ranks(jobs.shards, n, False, True, 2)
    for epoch in range(2):
        assert sorted(r0[epoch] + r1[epoch]) == list(range(n))
        assert r0[epoch] + r1[epoch] == list(range(n))  # contiguous blocks, rank order


def test_exact_eval_gathers_back_in_dataset_order(run_ranks):
    outs = run_ranks(jobs.exact_eval, 11)
    assert outs[0] == outs[1] == [2 * i for i in range(11)]


def test_loader_reshuffles_without_ring_epochs(run_ranks):
    r0, _ = run_ranks(jobs.shards, 16, True, False, 3, False)
    assert r0[0] != r0[1] and r0[1] != r0[2]


def test_same_global_order_for_any_world_size(run_ranks):
    """One process x batch 2b sees, per step, the union of what 2 ranks x batch b see."""
    n, b = 16, 2
    r0, r1 = run_ranks(jobs.shards, n, True, False, 1, True, b)
    (single,) = jobs.shards(n, True, False, 1, True, 2 * b)
    for step in range(n // (2 * b)):
        two = set(r0[0][step * b : (step + 1) * b] + r1[0][step * b : (step + 1) * b])
        assert two == set(single[step * 2 * b : (step + 1) * 2 * b])


def test_exact_sampler_sizes_differ_by_at_most_one():
    sizes = [len(ExactSampler(10, 4, r)) for r in range(4)]
    assert sizes == [3, 3, 2, 2]
    assert [i for r in range(4) for i in ExactSampler(10, 4, r)] == list(range(10))


def test_user_sampler_is_sharded_consistently():
    weights = torch.ones(20)
    shards = []
    for rank in range(2):
        s = ShardedSampler(WeightedRandomSampler(weights, 20), num_replicas=2, rank=rank, seed=5)
        s.set_epoch(1)
        shards.append(list(s))
    # both ranks drew the same full sequence (same seed + epoch) and took alternate indices
    full = []
    for a, b in zip(*shards):
        full += [a, b]
    again = ShardedSampler(WeightedRandomSampler(weights, 20), num_replicas=1, rank=0, seed=5)
    again.set_epoch(1)
    assert full == list(again)


def test_user_distributed_sampler_must_match_rank():
    ds = TensorDataset(torch.arange(8))
    with pytest.raises(rt.RingtrainError, match="num_replicas"):
        make_loader(
            ds, batch_size=2, shuffle=False, drop_last=False, exact=False, rank=0, world_size=1, seed=0,
            device=torch.device("cpu"), sampler=DistributedSampler(ds, num_replicas=2, rank=1),
        )


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"batch_size": 0}, "batch_size=0"),
        ({"batch_size": -3}, "batch_size=-3"),
        ({"batch_size": 2, "batch_sampler": [[0, 1]]}, "batch_sampler"),
        ({"batch_size": 2, "shuffle": True, "sampler": [0, 1]}, "shuffle=True"),
    ],
)
def test_bad_loader_arguments(kwargs, needle):
    ring = rt.Ring()
    with pytest.raises(rt.RingtrainError, match="HINT") as info:
        ring.loader(TensorDataset(torch.arange(8)), **kwargs)
    assert needle in str(info.value)


def test_dataset_smaller_than_world_size(run_ranks):
    errors = run_ranks(jobs.loader_error, 1, 4)
    assert all("fewer than the 2 ranks" in e and "HINT:" in e for e in errors)


def test_batches_move_to_device_recursively():
    batch = {"x": torch.ones(2), "pair": (torch.zeros(1), [torch.ones(1)]), "name": "a"}
    moved = move_to_device(batch, torch.device("cpu"))
    assert moved["name"] == "a" and torch.equal(moved["pair"][1][0], torch.ones(1))


def test_moved_mappings_keep_their_type():
    # What a collate_fn may return; type(batch)({...}) turned a defaultdict into a TypeError.
    import collections
    import types

    batch = collections.defaultdict(list, {"x": torch.ones(2)})
    moved = move_to_device(batch, torch.device("cpu"))
    assert type(moved) is collections.defaultdict and moved.default_factory is list
    assert torch.equal(moved["x"], torch.ones(2)) and moved["missing"] == [] and "missing" not in batch
    ordered = move_to_device(collections.OrderedDict([("b", torch.zeros(1)), ("a", torch.ones(1))]), torch.device("cpu"))
    assert type(ordered) is collections.OrderedDict and list(ordered) == ["b", "a"]
    frozen = move_to_device(types.MappingProxyType({"x": torch.ones(1)}), torch.device("cpu"))
    assert type(frozen) is types.MappingProxyType and torch.equal(frozen["x"], torch.ones(1))


def test_single_process_loader_uses_whole_dataset():
    ring = rt.Ring(seed=0)
    loader = ring.loader(TensorDataset(torch.arange(10)), batch_size=4, shuffle=True)
    seen = [torch.cat([x for (x,) in loader]).tolist() for _ in ring.epochs(2)]
    assert sorted(seen[0]) == list(range(10)) and seen[0] != seen[1]
    assert len(loader) == 3 and loader.batch_size == 4


class _Crops(torch.utils.data.Dataset):
    """Each item is a list of `samples` dicts, as MONAI's RandCropByPosNegLabeld(num_samples=...) returns."""

    def __init__(self, n: int, samples: int):
        self.n, self.samples, self.tag = n, samples, "not initialised"

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> list:
        return [{"img": torch.full((1, 2), float(10 * i + k)), "tag": self.tag} for k in range(self.samples)]


def _flatten(items: list) -> dict:
    # What monai.data.list_data_collate does with such items: one batch of batch x samples crops.
    crops = [crop for item in items for crop in item]
    return {"img": torch.cat([c["img"] for c in crops]), "tag": [c["tag"] for c in crops]}


def _mark_worker(worker_id: int) -> None:
    torch.utils.data.get_worker_info().dataset.tag = f"worker {worker_id}"


@pytest.mark.parametrize("workers", [0, 1])
def test_loader_keeps_the_collate_fn_and_worker_init_fn_it_is_given(workers):
    ds = _Crops(8, samples=3)
    loader = make_loader(ds, batch_size=2, shuffle=False, drop_last=False, exact=False, rank=1, world_size=2,
                         seed=0, device=torch.device("cpu"), collate_fn=_flatten, worker_init_fn=_mark_worker,
                         num_workers=workers)
    batches = list(loader)
    # rank 1 of 2 takes indices 1, 3, 5, 7 (DistributedSampler, no shuffle): 2 volumes x 3 crops per batch
    assert [b["img"].shape for b in batches] == [torch.Size([6, 2])] * 2
    assert batches[0]["img"][:, 0].tolist() == [10, 11, 12, 30, 31, 32]
    expected_tag = "worker 0" if workers else "not initialised"
    assert {t for b in batches for t in b["tag"]} == {expected_tag}


def test_monai_list_data_collate_through_ring_loader():
    monai = pytest.importorskip("monai", reason="monai is not installed (pip install -e '.[monai]')")
    import numpy as np
    from monai.transforms import RandCropByPosNegLabeld

    rng = np.random.RandomState(0)
    volumes = [{"img": rng.rand(1, 8, 8, 8).astype("float32"), "seg": (rng.rand(1, 8, 8, 8) > 0.5).astype("float32")}
               for _ in range(4)]
    crop = RandCropByPosNegLabeld(keys=["img", "seg"], label_key="seg", spatial_size=[4, 4, 4], num_samples=3)
    ring = rt.Ring(seed=0)
    loader = ring.loader(monai.data.Dataset(volumes, transform=crop), batch_size=2,
                         collate_fn=monai.data.list_data_collate)
    shapes = [tuple(batch["img"].shape) for batch in loader]
    assert shapes == [(6, 1, 4, 4, 4)] * 2  # 2 volumes x 3 crops each, flattened into one batch


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterable_dataset_is_shared_out_with_no_duplicates(run_ranks, workers):
    """Issue 30, item 4: each rank and each DataLoader worker reads its own share of a stream; together the
    ranks see every item once per epoch, the same share every epoch, and a resumed pass gives the rest."""
    per_rank = run_ranks(jobs.stream_shares, 24, workers, 2)
    first, second, resumed = zip(*per_rank)
    assert sorted(v for share in first for v in share) == list(range(24))
    assert first == second
    for rank in range(2):
        assert resumed[rank] == first[rank][4:]  # 2 batches of 2 skipped: the rest of this rank's share


def test_an_iterable_dataset_takes_no_sampler_or_shuffle():
    ring = rt.Ring()
    with pytest.raises(rt.RingtrainError, match="(?s)IterableDataset with shuffle=True.*HINT"):
        ring.loader(jobs.Stream(8), batch_size=2, shuffle=True)
