"""strategy='dp': DataParallel over visible GPUs; on CPU it runs on the one device and says so once."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import _ring_jobs as jobs
import ringtrain as rt

pytestmark = pytest.mark.timeout(120)

needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 or more CUDA GPUs")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour")
def test_dp_on_cpu_runs_and_warns_once():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        ring = rt.Ring(strategy="dp")
        model = ring.setup(jobs.small_model())
    messages = [str(w.message) for w in caught if "strategy='dp'" in str(w.message)]
    assert len(messages) == 1 and "no GPU" in messages[0]
    assert not isinstance(model, nn.DataParallel)
    loader = ring.loader(jobs.regression_data(32), batch_size=8)
    assert loader.batch_size == 8 and ring.global_batch_size == 8
    x, y = next(iter(loader))
    F.cross_entropy(model(x), y).backward()


def test_dp_refuses_several_processes(run_ranks):
    errors = run_ranks(jobs.ring_error, strategy="dp")
    assert all("strategy='dp'" in e and "HINT:" in e for e in errors)


@pytest.mark.gpu
@needs_two_gpus
def test_dataparallel_on_gpus_matches_single_device():
    n = torch.cuda.device_count()
    ring = rt.Ring(strategy="dp", seed=0)
    model = jobs.small_model()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert isinstance(model, nn.DataParallel) and ring.device == torch.device("cuda", 0)
    loader = ring.loader(jobs.regression_data(16 * n), batch_size=4)
    assert loader.batch_size == 4 * n and ring.global_batch_size == 4 * n
    for x, y in loader:
        ring.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    reference = jobs.train(4 * n, 1, n=16 * n, device="cpu")
    assert (jobs.flat_params(model) - reference).abs().max().item() <= 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp16_scaler_on_cuda_skips_inf_steps():
    ring = rt.Ring(precision="16-mixed")
    model = jobs.small_model()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = (t.cuda() for t in jobs.regression_data(16).tensors)
    before = jobs.flat_params(model)
    ring.backward(F.cross_entropy(model(x), y))
    next(model.parameters()).grad[0, 0] = float("inf")
    optimizer.step()
    assert torch.equal(before, jobs.flat_params(model))


def _bn_model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def test_dp_over_several_gpus_refuses_sync_batchnorm(monkeypatch):
    # Two GPUs, simulated: the CUDA queries the strategy asks are replaced (no GPU here).
    from ringtrain.parallel import environments
    from ringtrain.strategies import DataParallel
    from ringtrain.parallel.syncbn import convert_sync_batchnorm

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    strategy = DataParallel().attach(environments.detect({}, []))
    assert strategy.device_ids == [0, 1]
    # Ring(strategy="dp", sync_batchnorm=True) is refused before anything runs ...
    with pytest.raises(rt.RingtrainError, match="sync_batchnorm=True with strategy='dp'"):
        strategy.configure(sync_batchnorm=True)
    # ... and a model converted by hand is refused when it is wrapped.
    for synced in (convert_sync_batchnorm(_bn_model()), nn.SyncBatchNorm.convert_sync_batchnorm(_bn_model())):
        with pytest.raises(rt.RingtrainError, match=r"strategy='dp' cannot synchronise BatchNorm .* at 1\)") as info:
            strategy.wrap_module(synced)
        assert "HINT: use strategy='ddp'" in str(info.value)


@pytest.mark.gpu
@needs_two_gpus
def test_dp_sync_batchnorm_is_refused_at_setup():
    ring = rt.Ring(strategy="dp", sync_batchnorm=True)
    with pytest.raises(rt.RingtrainError, match="DataParallel keeps per-GPU statistics"):
        ring.setup(_bn_model())
