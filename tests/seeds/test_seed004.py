"""Seed 004 (rentainhe/pytorch-distributed-training): main_worker started by the launcher
(distributed.py) and by mp.spawn (distributed_mp.py), through `ringtrain run` and `rt.spawn`, and
the seed's `batch_size / nprocs`, which no DataLoader accepts, reported by name."""

from __future__ import annotations

import pytest
import torch

import _toy
from _run import HERE, TOL, batches_of, epoch_order, falls, free_port, ok, reference, result, run, same_params
from ringtrain.doctor import check_source

pytestmark = pytest.mark.timeout(180)


def sgd_reference(reshuffle: bool):
    model = _toy.Net()
    orders = [epoch_order(_toy.SAMPLES, e if reshuffle else 0) for e in range(6)]
    return reference(model, torch.optim.SGD(model.parameters(), lr=0.5), [b for o in orders for b in batches_of(o, 16)])


def test_launch_form_under_ringtrain_run(tmp_path):
    """CUDA_VISIBLE_DEVICES=0,1 python -m torch.distributed.launch --nproc_per_node=2 distributed.py"""
    out, port = tmp_path / "launch.pt", free_port()
    ok(run(["ringtrain", "run", "--nproc_per_node=2", f"--master_port={port}", "seed004_distributed.py",
            "--port", str(port)], out))
    got = result(out)
    assert falls(got["losses"])
    assert same_params(got["params"], sgd_reference(reshuffle=False)) < TOL


def test_seed_batch_division_is_reported_by_name(tmp_path):
    """The seed's `mini_batch_size = batch_size / nprocs` is a float: rank 0's DataLoader raises,
    and ringtrain run names the rank and the error; doctor names the line before anything runs."""
    source = (HERE / "seed004_distributed.py").read_text()
    fixed = "mini_batch_size = args.batch_size // nprocs"
    assert source.count(fixed) == 1
    script = tmp_path / "distributed.py"
    script.write_text(source.replace(fixed, "mini_batch_size = args.batch_size / nprocs"))
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if "trainloader = DataLoader(" in text)
    assert ("batch-size-float", line) in {(f.rule, f.line) for f in check_source(script.read_text(), str(script))}

    port = free_port()
    res = run(["ringtrain", "run", "--nproc_per_node=2", f"--master_port={port}", str(script), "--port", str(port)],
              PYTHONPATH=str(HERE))
    text = res.stdout + res.stderr
    assert res.returncode == 1, text
    assert "failed first" in text and "batch_size should be a positive integer value" in text
    assert "HINT:" in text


def test_mp_spawn_form_with_rt_spawn(tmp_path):
    """CUDA_VISIBLE_DEVICES=0,1 python distributed_mp.py, with rt.spawn in place of mp.spawn."""
    out = tmp_path / "mp.pt"
    ok(run(["python", "seed004_distributed_mp.py", "--port", str(free_port())], out))
    got = result(out)
    assert falls(got["losses"])
    assert same_params(got["params"], sgd_reference(reshuffle=False)) < TOL


def test_four_line_version_under_rt_spawn(tmp_path):
    out = tmp_path / "ring.pt"
    text = ok(run(["python", "seed004_ring.py"], out))
    assert "global batch 16 = 8 per device x 2 device(s) x 1 accumulation step(s)" in text
    assert "test accuracy" in text
    got = result(out)
    assert falls(got["losses"])
    assert same_params(got["params"], sgd_reference(reshuffle=True)) < TOL
