"""Mismatched collectives raise a clear error on every rank, quickly, instead of hanging."""

from __future__ import annotations

import pytest

import _hvd_jobs as jobs

pytestmark = pytest.mark.timeout(180)

EXPECT = {
    "shape": ("mismatched collectives", "allreduce(float32[3]", "allreduce(float32[4]"),
    "dtype": ("mismatched collectives", "float32[3]", "float64[3]"),
    "op": ("mismatched collectives", "op=Sum", "op=Max"),
    "root": ("mismatched collectives", "root_rank=0", "root_rank=1"),
    "kind": ("mismatched collectives", "allreduce(", "broadcast("),
    "allgather_rest": ("mismatched collectives", "allgather(float32[2, 3]", "allgather(float32[2, 4]"),
    "reducescatter_shape": ("mismatched collectives", "reducescatter(float32[4, 2]", "reducescatter(float32[5, 2]"),
    "scale": ("mismatched collectives",),
    "grouped_layout": ("mismatched collectives",),
}


def test_mismatches_raise_on_every_rank_within_seconds(run_ranks):
    results = run_ranks(jobs.mismatches, nprocs=2)
    for name, needles in EXPECT.items():
        for rank, res in enumerate(results):
            message, seconds = res[name]
            assert message.startswith("RingtrainError"), (name, rank, message)
            assert "HINT:" in message
            for needle in needles:
                assert needle in message, (name, rank, needle, message)
            assert seconds < 5, (name, rank, seconds)
    # an invalid argument on one rank: that rank says what is wrong, the other names it
    bad_root = [res["bad_root"][0] for res in results]
    assert "root_rank=0" not in bad_root[1] and "root_rank=7" in bad_root[1] and "not a rank" in bad_root[1]
    assert "rank(s) [1] called broadcast with invalid arguments" in bad_root[0]
    bad_splits = [res["bad_splits"][0] for res in results]
    assert "splits=[3, 3]" in bad_splits[1] and "rank(s) [1] called alltoall" in bad_splits[0]
    # the group is still in step afterwards, with and without checks
    for res in results:
        assert res["after"].item() == 1.0
        assert res["unchecked"].item() == 1.0
        assert res["unchecked_ag"].tolist() == [0, 1, 1]
