"""Checkpoints: rank-0 atomic writes, unwrapped state, plain-PyTorch loading, resume."""

from __future__ import annotations

import os

import pytest
import torch

import _ring_jobs as jobs
import ringtrain as rt
from ringtrain import checkpoint

pytestmark = pytest.mark.timeout(180)


def test_saved_under_two_ranks_loads_in_plain_pytorch(run_ranks, tmp_path):
    path = str(tmp_path / "ckpt.pt")
    params = run_ranks(jobs.train, 8, 1, save=path)[0]
    raw = torch.load(path)  # plain torch, default weights_only
    assert not any(k.startswith("module.") for k in raw["model"])
    plain = jobs.small_model()
    plain.load_state_dict(raw["model"])
    assert torch.equal(jobs.flat_params(plain), params)
    assert raw["epoch"] == 0 and "state" in raw["optimizer"]
    assert [f for f in os.listdir(tmp_path) if f != "ckpt.pt"] == [], "temporary files left behind"


def test_two_rank_checkpoint_loads_in_one_process(run_ranks, tmp_path):
    path = str(tmp_path / "ckpt.pt")
    params = run_ranks(jobs.train, 8, 1, save=path)[0]
    ring = rt.Ring()
    model = ring.setup(jobs.small_model())
    extras = ring.load(path, model=model)
    assert extras["epoch"] == 0
    assert torch.equal(jobs.flat_params(model), params)


def test_resume_mid_epoch_matches_uninterrupted_run(run_ranks, tmp_path):
    path = str(tmp_path / "mid.pt")
    full = run_ranks(jobs.train, 8, 2)
    run_ranks(jobs.train, 8, 2, save=path, save_after_batches=3)
    resumed = run_ranks(jobs.train, 8, 2, load=path)
    assert (resumed[0] - full[0]).abs().max().item() <= 1e-6


def test_resume_at_epoch_boundary_matches_uninterrupted_run(tmp_path):
    path = str(tmp_path / "epoch.pt")
    full = jobs.train(16, 3)
    jobs.train(16, 2, save=path)
    resumed = jobs.train(16, 3, load=path)
    assert (resumed - full).abs().max().item() <= 1e-6


def test_loads_plain_state_dict_with_or_without_module_prefix(tmp_path):
    src = jobs.small_model()
    with torch.no_grad():
        for p in src.parameters():
            p.add_(1.0)
    for name, sd in {
        "plain.pt": src.state_dict(),
        "prefixed.pt": {f"module.{k}": v for k, v in src.state_dict().items()},
        "nested.pt": {"model": {f"module.{k}": v for k, v in src.state_dict().items()}},
    }.items():
        torch.save(sd, tmp_path / name)
        ring = rt.Ring()
        model = ring.setup(jobs.small_model())
        ring.load(str(tmp_path / name), model=model)
        assert torch.equal(jobs.flat_params(model), jobs.flat_params(src)), name


def test_wrong_model_lists_missing_and_unexpected_keys(tmp_path):
    torch.save({"model": torch.nn.Linear(3, 3).state_dict()}, tmp_path / "other.pt")
    ring = rt.Ring()
    model = ring.setup(jobs.small_model())
    with pytest.raises(rt.RingtrainError, match="missing keys: 0.weight") as info:
        ring.load(str(tmp_path / "other.pt"), model=model)
    assert "unexpected keys: weight" in str(info.value) and "HINT:" in str(info.value)


def test_unreadable_and_missing_checkpoints(tmp_path):
    ring = rt.Ring()
    model = ring.setup(jobs.small_model())
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(rt.RingtrainError, match="cannot read the checkpoint"):
        ring.load(str(tmp_path / "junk.pt"), model=model)
    with pytest.raises(rt.RingtrainError, match="no checkpoint at"):
        ring.load(str(tmp_path / "absent.pt"), model=model)
    with pytest.raises(rt.RingtrainError, match="no entry 'net'"):
        ring.save(str(tmp_path / "ok.pt"), model=model)
        ring.load(str(tmp_path / "ok.pt"), net=model)


def test_checkpoint_with_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"model": Evil()}, tmp_path / "evil.pt")
    ring = rt.Ring()
    with pytest.raises(rt.RingtrainError, match="weights_only"):
        ring.load(str(tmp_path / "evil.pt"), model=ring.setup(jobs.small_model()))


def test_failed_save_raises_on_every_rank_without_hanging(run_ranks, tmp_path):
    errors = run_ranks(jobs.save_failure, str(tmp_path / "missing-folder" / "ckpt.pt"))
    assert all("rank 0" in e and "does not exist" in e and "HINT:" in e for e in errors)


def test_atomic_save_keeps_previous_file_on_failure(tmp_path):
    path = tmp_path / "ckpt.pt"
    checkpoint.atomic_save({"v": torch.tensor(1)}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        checkpoint.atomic_save({"v": Unpicklable()}, path)
    assert torch.load(path)["v"].item() == 1
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_rng_state_round_trip():
    state = checkpoint.capture_rng()
    a = (torch.rand(3), __import__("numpy").random.rand(), __import__("random").random())
    checkpoint.restore_rng(state)
    b = (torch.rand(3), __import__("numpy").random.rand(), __import__("random").random())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]
