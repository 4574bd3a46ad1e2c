"""Seed 001 (Horovod migration): the Horovod script started with horovodrun's own command line
(`-np`, `-H`, `python x.py`) through `ringtrain run --horovod`; with Average it reaches the
parameters of one process trained on the same global batches."""

from __future__ import annotations

import pytest

import _toy
from _run import TOL, batches_of, epoch_order, falls, ok, reference, result, run, same_params

pytestmark = pytest.mark.timeout(180)
EPOCHS = 6


def lars_reference(shuffle_each_epoch: bool):
    model = _toy.Net()
    optimizer = _toy.LARS(model.parameters(), lr=1.0, momentum=0.9)
    orders = [epoch_order(_toy.SAMPLES, e if shuffle_each_epoch else 0) for e in range(EPOCHS)]
    batches = [b for order in orders for b in batches_of(order, 16, drop_last=True)]
    return reference(model, optimizer, batches)


def test_horovodrun_command_form(tmp_path):
    """horovodrun -np 2 python x.py  ->  ringtrain run --horovod -np 2 python x.py"""
    out = tmp_path / "hvd.pt"
    text = ok(run(["ringtrain", "run", "--horovod", "-np", "2", "python", "seed001_horovod.py"], out))
    assert "(2 workers)" in text
    got = result(out)
    assert falls(got["losses"])
    assert same_params(got["params"], lars_reference(shuffle_each_epoch=False)) < TOL


def test_hosts_form_with_adasum_fp16_and_accumulation(tmp_path):
    """horovodrun -np 2 -H IP1:1,IP2:1 python x.py --use_adasum ... : two nodes, here on loopback."""
    out = tmp_path / "hosts.pt"
    text = ok(run(["ringtrain", "run", "--horovod", "-np", "2", "-H", "localhost:1,127.0.0.1:1", "python",
                   "seed001_horovod.py", "--use_adasum", "--fp16_allreduce", "--batches_per_allreduce", "2"], out))
    assert "(2 workers)" in text
    assert falls(result(out)["losses"])


def test_four_line_version_with_the_horovod_strategy(tmp_path):
    out = tmp_path / "ring.pt"
    ok(run(["ringtrain", "run", "--horovod", "-np", "2", "python", "seed001_ring.py"], out))
    got = result(out)
    assert falls(got["losses"])
    assert same_params(got["params"], lars_reference(shuffle_each_epoch=True)) < TOL
