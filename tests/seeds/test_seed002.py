"""Seed 002 ("Pytorch中的分布式神经网络训练"): a model split over two devices, gradient
accumulation, the DistributedDataParallel gist with its loss logging and SyncBatchNorm, and the
two-node commands as printed -- each started the seed's way, through ringtrain."""

from __future__ import annotations

import pytest
import torch

import _toy
from _run import (HERE, TOL, batches_of, epoch_order, falls, free_port, full_loss, ok, reference, result, run,
                  same_params)
from ringtrain.doctor import check_source

pytestmark = pytest.mark.timeout(180)


def sgd_reference(batches, lr=0.5, zero_grad=True, batchnorm=False):
    model = _toy.Net(batchnorm)
    return reference(model, torch.optim.SGD(model.parameters(), lr=lr), batches, zero_grad=zero_grad)


def in_order(size, epochs=6):
    return [b for _ in range(epochs) for b in batches_of(list(range(_toy.SAMPLES)), size)]


def shuffled(size, epochs=6, reshuffle=True):
    return [b for e in range(epochs) for b in batches_of(epoch_order(_toy.SAMPLES, e if reshuffle else 0), size)]


def test_model_split_over_two_devices_trains(tmp_path):
    out = tmp_path / "split.pt"
    ok(run(["python", "seed002_split.py"], out))
    got = result(out)
    assert falls(got["losses"])
    assert same_params(got["params"], sgd_reference(in_order(16))) < TOL


def test_split_model_data_parallel_under_ringtrain_run(tmp_path):
    """rt.split's list of stages, then ring.setup: DDP over the split model, placement kept."""
    out = tmp_path / "split_ddp.pt"
    ok(run(["ringtrain", "run", "--nproc-per-node", "2", "seed002_split_ring.py"], out))
    got = result(out)
    assert falls(got["losses"])
    assert same_params(got["params"], sgd_reference(shuffled(16))) < TOL


def test_accumulation_loop_equals_the_big_batch(tmp_path):
    out = tmp_path / "acc.pt"
    ok(run(["python", "seed002_accumulate.py"], out))
    got = result(out)
    assert falls(got["losses"])
    assert same_params(got["params"], sgd_reference(in_order(32))) < TOL


@pytest.mark.parametrize("cmd, line", [
    # one process is the same path as the seed's own loop above: a soak-run variant only
    pytest.param(["python", "seed002_accumulate_ring.py"],
                 "global batch 32 = 8 per device x 1 device(s) x 4 accumulation step(s)", marks=pytest.mark.stress),
    (["ringtrain", "run", "--nproc-per-node", "2", "seed002_accumulate_ring.py", "--fit", "4"],
     "global batch 32 = 4 per device x 2 device(s) x 4 accumulation step(s)"),
], ids=["one-process", "two-processes"])
def test_ring_accumulation_equals_the_big_batch(tmp_path, cmd, line):
    out = tmp_path / "acc_ring.pt"
    text = ok(run(cmd, out))
    assert line in text
    got = result(out)
    assert falls(got["losses"])
    assert same_params(got["params"], sgd_reference(in_order(32))) < TOL


def test_gist_runs_under_ringtrain_run_as_launched(tmp_path):
    """python -m torch.distributed.launch --nproc_per_node=4 --nnodes=1 --node_rank=0 --master_port=1234 train.py"""
    out = tmp_path / "gist.pt"
    ok(run(["ringtrain", "run", "--nproc_per_node=2", "--nnodes=1", "--node_rank=0", f"--master_port={free_port()}",
            "seed002_gist.py"], out))
    got = result(out)
    # The gist never zeroes gradients; one process fed the same global batches does the same.
    assert same_params(got["params"], sgd_reference(shuffled(2, epochs=1), lr=0.01, zero_grad=False)) < TOL
    assert full_loss(got["params"]) < 0.8 * full_loss(_toy.Net().state_dict())


def test_gist_follow_up_reduce_on_rank_0_only_is_named():
    """get_reduced_loss (a dist.reduce) called under `if args.local_rank == 0`: rank 0 waits in reduce
    while rank 1 is in the next step's all-reduce, and the job hangs (Gloo and NCCL alike). It is not run
    here; `ringtrain doctor` names it before it runs, and the four-line version reduces on every rank."""
    source = (HERE / "seed002_gist.py").read_text()
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "torch.distributed.reduce(" in text)
    findings = check_source(source, "seed002_gist.py")
    assert ("collective-on-one-rank", line) in {(f.rule, f.line) for f in findings}, findings
    assert any("rank" in f.message for f in findings if f.rule == "collective-on-one-rank")


def test_gist_four_line_version_reduces_on_every_rank(tmp_path):
    out = tmp_path / "gist_ring.pt"
    text = ok(run(["ringtrain", "run", "--nproc-per-node", "2", "seed002_gist_ring.py"], out))
    assert "Current batch Loss" in text
    got = result(out)
    assert same_params(got["params"], sgd_reference(shuffled(2, epochs=1), lr=0.01)) < TOL
    # rank 0's first reduced loss is the mean of both ranks' first losses, at the starting weights
    x, y = _toy.dataset().tensors
    first = epoch_order(_toy.SAMPLES, 0)[:2]
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(_toy.Net()(x[first]), y[first]).item()
    assert abs(got["losses"][0] - expected) < 1e-5
    assert len(got["losses"]) == _toy.SAMPLES // 2


def test_second_node_command_as_printed_is_refused():
    """The seed's second node runs `--nnodes=1 --node_rank=1`: a node rank that cannot exist."""
    res = run(["ringtrain", "run", "--nproc_per_node=4", "--nnodes=1", "--node_rank=1", "--master_addr=192.168.1.1",
               "--master_port=1234", "seed002_gist.py"], timeout=60)
    text = res.stdout + res.stderr
    assert res.returncode == 2, text
    assert "--node-rank 1" in text and "--nnodes 1" in text
    assert "HINT:" in text


def test_syncbn_block_matches_one_process_with_the_global_batch(tmp_path):
    out = tmp_path / "syncbn.pt"
    ok(run(["ringtrain", "run", "--nproc_per_node=2", "seed002_syncbn.py"], out))
    got = result(out)
    assert falls(got["losses"])
    want = sgd_reference(shuffled(16, epochs=4), batchnorm=True)
    assert same_params(got["params"], want) < TOL  # running mean and variance included
