"""Seed 003 ("MONAI&PyTorch 如何进行分布式训练"): the set_epoch experiment, plain and with a ring
loader, and MONAI's 3D UNet scripts -- DataParallel and the DDP script started by the launcher --
on small volumes (the MONAI tests skip when MONAI is not installed: `pip install monai nibabel`)."""

from __future__ import annotations

import pytest
import torch

from _run import HERE, falls, ok, result, run

pytestmark = pytest.mark.timeout(240)


def expected_names(epoch: int, rank: int, world: int = 2, n: int = 21, batch: int = 5) -> list[int]:
    """DistributedSampler(shuffle=True, seed=0): the epoch's permutation padded to a multiple of the
    ranks, every world-th index from rank on, cut to whole batches; names are index + 1."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch)).tolist()
    order += order[: (-n) % world]
    mine = order[rank::world]
    return [i + 1 for i in mine[: len(mine) // batch * batch]]


def orders(out, world: int = 2):
    return [torch.load(f"{out}.rank{rank}") for rank in range(world)]


@pytest.mark.parametrize("set_epoch", [False, True], ids=["experiment-1", "experiment-2"])
def test_set_epoch_experiment(tmp_path, set_epoch):
    out = tmp_path / "names"
    ok(run(["ringtrain", "run", "--nproc-per-node", "2", "seed003_set_epoch.py", *(["--set_epoch"] if set_epoch else [])],
           out))
    for rank, drawn in enumerate(orders(out)):
        assert drawn == [expected_names(e if set_epoch else 0, rank) for e in range(3)]
        assert (drawn[0] == drawn[1] == drawn[2]) is (not set_epoch)  # experiment 1: the same order every epoch


def test_ring_loader_reshuffles_without_set_epoch(tmp_path):
    out = tmp_path / "names"
    ok(run(["ringtrain", "run", "--nproc-per-node", "2", "seed003_set_epoch_ring.py"], out))
    for rank, drawn in enumerate(orders(out)):
        assert drawn == [expected_names(e, rank) for e in range(3)]
        assert drawn[0] != drawn[1] != drawn[2]


@pytest.fixture(scope="module")
def volumes(tmp_path_factory):
    """One folder of synthetic volumes, written by the first MONAI script and read by the next."""
    pytest.importorskip("monai", reason="MONAI is not installed (pip install monai nibabel)")
    pytest.importorskip("nibabel", reason="nibabel is not installed (pip install monai nibabel)")
    return tmp_path_factory.mktemp("monai") / "testdata"


def monai_run(cmd, tmp_path, volumes):
    out = tmp_path / "monai.pt"
    text = ok(run([*cmd, "-d", str(volumes)], out, cwd=tmp_path, timeout=200))
    got = result(out)
    losses = got["losses"]
    assert len(losses) == 5 and min(losses[-2:]) < 0.85 * losses[0], losses  # random crops: allow a noisy epoch
    saved = torch.load(tmp_path / "final_model.pth", weights_only=True)
    return text, saved


def test_monai_dataparallel_script(tmp_path, volumes):
    text, saved = monai_run(["python", str(HERE / "seed003_monai_dp.py")], tmp_path, volumes)
    assert all(key.startswith("module.") for key in saved)  # a DataParallel state dict, as the seed saves it


def test_monai_ddp_script_under_ringtrain_run(tmp_path, volumes):
    """python -m torch.distributed.launch --nproc_per_node=2 train.py -d DIR -> ringtrain run ... (same arguments)"""
    text, saved = monai_run(["ringtrain", "run", "--nproc_per_node=2", str(HERE / "seed003_monai_ddp.py")],
                            tmp_path, volumes)
    assert text.count("train completed") == 1  # rank 1 writes to /dev/null, as the seed makes it
    # Rank 0 alone saved, and its file has DDP's `module.` prefix (ring.save writes the plain names).
    assert all(key.startswith("module.") for key in saved)
