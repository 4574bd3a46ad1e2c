"""Issue 36, items 3 and 4: each rank's own ``ring.extras`` and ``ring.keep`` state come back to it; the common
types round-trip through the safe reader; a value that could not be read back is refused at the assignment or the
save, naming key and type; at another world size only what can follow does (checkpoint/per_rank.py)."""

from __future__ import annotations

import datetime
import pathlib
from fractions import Fraction

import numpy as np
import pytest
import torch

import _own_state_jobs as jobs
from ringtrain.checkpoint import files


@pytest.mark.timeout(180)
def test_each_rank_gets_its_own_extras_and_kept_state_back(run_ranks, tmp_path):
    path = str(tmp_path / "ckpt.pt")
    got = run_ranks(jobs.save_own_state, path)
    for rank, mine in enumerate(got):
        extras = mine["extras"]
        assert mine["position"] == 100 * rank + 7
        assert extras["mine"] == 10 + rank and type(extras["mine"]) is np.int64
        assert extras["shared"] == 0.25 and type(extras["shared"]) is np.float64
        best = extras["best"]
        assert type(best) is jobs.Best and best.loss == 1.5 + rank and type(best.loss) is np.float64
        assert best.when == datetime.datetime(2026, 12, 1, 12, rank) and best.path == pathlib.Path(f"/r{rank}")
        assert extras["phase"] is jobs.Phase.MAIN and extras["frac"] == Fraction(1, 3 + rank)
        assert ("rank0_only" in extras) == (rank == 0)
    # The file reads back with the safe reader, and its top-level entries are rank 0's, as before.
    ckpt = files.read(path)
    assert ckpt["ringtrain"]["extras"] and len(ckpt["ringtrain"]["ranks"]) == 2


@pytest.mark.timeout(180)
def test_at_another_world_size_a_per_rank_value_is_refused_naming_it(run_ranks, tmp_path):
    path = str(tmp_path / "ckpt.pt")
    run_ranks(jobs.save_own_state, path)
    got = jobs.load_at_one_process(path)
    assert "error" in got, got
    assert "differs between the 2 ranks" in got["error"] or "ring.keep(loader)" in got["error"], got["error"]
    assert "HINT: resume with 2 ranks" in got["error"]


@pytest.mark.timeout(180)
def test_at_another_world_size_shared_and_rank0_values_follow(run_ranks, tmp_path):
    path = str(tmp_path / "ckpt.pt")
    run_ranks(jobs.save_own_state, path, shared_only=True)
    got = jobs.load_at_one_process(path)
    assert got.get("extras") == {"shared": 0.25}, got
    assert got["position"] == 7


@pytest.mark.timeout(180)
def test_a_value_the_reader_would_refuse_is_refused_at_assignment_and_at_save(run_ranks, tmp_path):
    path = tmp_path / "ckpt.pt"
    got = run_ranks(jobs.bad_extra_refused, str(path))
    for mine in got:
        assert "ring.extras['fn']" in mine["assign"] and "function" in mine["assign"], mine
        assert "ring.extras['log']" in mine["save"] and "object" in mine["save"], mine
        assert "HINT:" in mine["save"]
    assert not path.exists()  # nothing was written


def test_a_plain_torch_load_still_reads_rank_0s_plain_extras(tmp_path):
    path = str(tmp_path / "one.pt")
    jobs.save_own_state(path)
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["rank0_only"] == "zero"
