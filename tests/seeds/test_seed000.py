"""Seed 000 ("PyTorch分布式训练2"): DataParallel, the legacy launcher's --local_rank script on one
node and on two, and env:// with the variables set by hand — each started the seed's way, through
ringtrain, and compared with one process trained on the same global batches."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import _toy
from _run import HERE, TOL, batches_of, epoch_order, falls, free_port, ok, quiet_env, reference, result, run, same_params

pytestmark = pytest.mark.timeout(180)
EPOCHS = 6


def ddp_reference(shuffle: bool = True, global_batch: int = 16):
    model = _toy.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    batches = [b for e in range(EPOCHS) for b in batches_of(epoch_order(_toy.SAMPLES, e, shuffle), global_batch)]
    return reference(model, optimizer, batches)


def test_dataparallel_script_trains_like_one_device(tmp_path):
    out = tmp_path / "dp.pt"
    ok(run(["python", "seed000_dataparallel.py"], out))
    got = result(out)
    assert falls(got["losses"])
    assert same_params(got["params"], ddp_reference(shuffle=False)) < TOL


def test_launch_script_runs_under_ringtrain_run(tmp_path):
    """python -m torch.distributed.launch --nproc_per_node=2 x.py  ->  ringtrain run --nproc_per_node=2 x.py"""
    out = tmp_path / "launch.pt"
    text = ok(run(["ringtrain", "run", "--nproc_per_node=2", "seed000_launch.py"], out))
    got = result(out)
    assert "epoch 5 loss" in text
    assert falls(got["losses"])
    assert same_params(got["params"], ddp_reference()) < TOL


def test_two_nodes_one_line_per_node(tmp_path):
    """The seed's two-node commands, one per node, on this machine. The seed's rank = local_rank
    holds on one node only, so the copy run here takes the launcher's RANK (the docstring says why)."""
    source = (HERE / "seed000_launch.py").read_text()
    seed_line = "rank = args.local_rank  # the seed"
    assert source.count(seed_line) == 1
    script = tmp_path / "seed000_launch_two_nodes.py"
    script.write_text(source.replace(seed_line, 'rank = int(os.environ["RANK"])  # two nodes: the global rank;'))
    out, port = tmp_path / "nodes.pt", free_port()
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "ringtrain", "run", "--nproc_per_node=1", "--nnodes=2", f"--node_rank={node}",
             "--master_addr=127.0.0.1", f"--master_port={port}", str(script)],
            cwd=HERE, env=quiet_env(PYTHONPATH=str(HERE), TWIN_OUT=str(out)),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node in (0, 1)
    ]
    texts = [node.communicate(timeout=150)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(t[-3000:] for t in texts)
    got = result(out)
    assert falls(got["losses"])
    assert same_params(got["params"], ddp_reference()) < TOL


def by_hand(rank: int, port: int, out=None, addr: str = "127.0.0.1") -> subprocess.Popen:
    env = quiet_env(MASTER_ADDR=addr, MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank))
    if out is not None:
        env["TWIN_OUT"] = str(out)
    return subprocess.Popen([sys.executable, "seed000_ring.py"], cwd=HERE, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_env_by_hand_forms_the_group(tmp_path):
    """The seed's env:// section: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK and nothing else."""
    out, port = tmp_path / "env.pt", free_port()
    procs = [by_hand(rank, port, out) for rank in (0, 1)]
    texts = [p.communicate(timeout=150)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(t[-3000:] for t in texts)
    assert "world size 2, env-by-hand" in texts[0]  # one job of two, not two jobs of one
    got = result(out)
    assert falls(got["losses"])
    assert same_params(got["params"], ddp_reference()) < TOL


def test_env_by_hand_on_another_machine_is_refused():
    """Without LOCAL_RANK the local rank is known only when the master is this machine."""
    proc = by_hand(1, 29500, addr="192.0.2.1")  # TEST-NET-1: documentation only, never this host
    text = proc.communicate(timeout=60)[0]
    assert proc.returncode != 0
    assert "LOCAL_RANK is not" in text and "MASTER_ADDR=192.0.2.1" in text
    assert "HINT: set LOCAL_RANK" in text
