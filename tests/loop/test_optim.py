"""Gradient accumulation: equivalence, one all-reduce per step, schedulers, epoch ends, batch policy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import _ring_jobs as jobs
import ringtrain as rt

pytestmark = pytest.mark.timeout(180)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("n", [96, 88])  # 88: the last window of each epoch is short (flushed)
def test_accumulate_k_micro_batches_equals_one_big_batch(n):
    big = jobs.train(16, 2, n=n)
    accumulated = jobs.train(4, 2, n=n, accumulate=4)
    assert max_diff(big, accumulated) <= 1e-5


def test_accumulation_on_two_ranks_equals_one_process(run_ranks):
    two = run_ranks(jobs.train, 4, 2, accumulate=2)
    assert max_diff(two[0], jobs.train(16, 2)) <= 1e-5


def test_one_allreduce_per_bucket_per_optimizer_step(run_ranks):
    # A tiny bucket cap gives several buckets, so "one per bucket" is a real check.
    tiny = {"bucket_cap_mb": 0.0002}
    _, plain = run_ranks(jobs.train, 4, 1, count_allreduce=True, setup_kwargs=tiny)[0]
    _, accumulated = run_ranks(jobs.train, 4, 1, count_allreduce=True, setup_kwargs=tiny, accumulate=4)[0]
    # 48 samples per rank, batch 4: 12 backward passes, and with accumulate=4, 3 windows.
    assert len(plain) == len(accumulated) == 12
    assert max(plain) > 1, "expected several buckets"
    boundaries = accumulated[3::4]
    assert sum(accumulated) == sum(boundaries), "no all-reduce may run inside a window"
    # Each optimizer step costs what one unaccumulated step costs: one call per bucket
    # (DDP's first step uses its initial bucket layout, hence compare step by step).
    assert boundaries == plain[:3]
    assert sum(accumulated) * 4 <= sum(plain) + 4 * max(plain)


def _loop(ring, model, optimizer, loader, scheduler=None):
    lrs, syncs = [], []
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        ring.backward(loss)
        syncs.append(ring.sync_now)
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    return lrs, syncs


def test_scheduler_through_setup_steps_only_on_boundaries():
    ring = rt.Ring(seed=0, accumulate=4)
    model = jobs.small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = ring.setup(model, optimizer, scheduler)
    loader = ring.loader(jobs.regression_data(88), batch_size=4)  # 22 micro-batches: windows 4,4,4,4,4,2
    lrs, syncs = _loop(ring, model, optimizer, loader, scheduler)
    assert syncs == ([False] * 3 + [True]) * 5 + [False, True]
    assert ring.optimizer_steps == 6
    assert lrs[-1] == pytest.approx(0.5**6)
    assert lrs[3] == pytest.approx(0.5) and lrs[2] == pytest.approx(1.0)


def test_scheduler_stepping_every_micro_batch_is_loud():
    ring = rt.Ring(seed=0, accumulate=4)
    model = jobs.small_model()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=1.0))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)  # made from it, not passed
    loader = ring.loader(jobs.regression_data(32), batch_size=4)
    with pytest.raises(rt.RingtrainError, match="changed in the middle of an accumulation window"):
        _loop(ring, model, optimizer, loader, scheduler)


def test_per_epoch_scheduler_made_from_optimizer_is_fine():
    ring = rt.Ring(seed=0, accumulate=4)
    model = jobs.small_model()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=1.0))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    loader = ring.loader(jobs.regression_data(32), batch_size=4)
    for _ in ring.epochs(2):
        _loop(ring, model, optimizer, loader)
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.25)


def test_setup_gates_the_same_optimizer_object():
    ring = rt.Ring(accumulate=2)
    model = jobs.small_model()
    original = torch.optim.Adam(model.parameters(), lr=0.1)
    _, optimizer = ring.setup(model, original)
    assert optimizer is original and isinstance(optimizer, torch.optim.Adam)
    before = jobs.flat_params(model)
    x, y = jobs.regression_data(8).tensors
    ring.backward(F.cross_entropy(model(x[:4]), y[:4]))
    optimizer.step()  # between boundaries: nothing happens
    assert torch.equal(before, jobs.flat_params(model))
    assert all(p.grad is not None for p in model.parameters()), "zero_grad must not clear mid-window"
    ring.backward(F.cross_entropy(model(x[4:]), y[4:]))
    optimizer.step()
    assert not torch.equal(before, jobs.flat_params(model))
    with pytest.raises(rt.RingtrainError, match="already set up"):
        ring.setup(jobs.small_model(), optimizer)


def test_state_dict_round_trip_of_gated_optimizer(tmp_path):
    ring = rt.Ring(accumulate=2)
    model = jobs.small_model()
    model, optimizer = ring.setup(model, torch.optim.Adam(model.parameters(), lr=0.1))
    x, y = jobs.regression_data(8).tensors
    for i in range(2):
        ring.backward(F.cross_entropy(model(x), y))
        optimizer.step()
    fresh = torch.optim.Adam(jobs.small_model().parameters(), lr=0.1)
    fresh.load_state_dict(optimizer.state_dict())
    assert fresh.state_dict()["state"][0]["step"].item() == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_bad_accumulate(bad):
    with pytest.raises(rt.RingtrainError, match="accumulate"):
        rt.Ring(accumulate=bad)


def test_same_global_batch_same_training(run_ranks):
    """single x16, dp x16 (CPU: one device), ddp 2x8, ddp 2x4x2, single 4x4: one result."""
    reference = jobs.train(16, 2)
    candidates = {
        "dp": jobs.train(16, 2, strategy="dp"),
        "single-acc4": jobs.train(4, 2, accumulate=4),
        "ddp-2x8": run_ranks(jobs.train, 8, 2)[0],
        "ddp-2x4-acc2": run_ranks(jobs.train, 4, 2, accumulate=2)[0],
    }
    for name, params in candidates.items():
        assert max_diff(params, reference) <= 1e-5, name


def test_global_batch_size_is_reported(capsys):
    ring = rt.Ring(accumulate=4)
    ring.loader(jobs.regression_data(32), batch_size=4)
    assert ring.global_batch_size == 16
    assert "global batch 16 = 4 per device x 1 device(s) x 4 accumulation step(s)" in capsys.readouterr().out


def test_scale_lr():
    assert rt.scale_lr(0.1, 256, 1024) == pytest.approx(0.4)
    assert rt.scale_lr(0.1, 256, 1024, rule="sqrt") == pytest.approx(0.2)
    with pytest.raises(rt.RingtrainError, match="rule"):
        rt.scale_lr(0.1, 256, 1024, rule="cubic")


def test_clip_grad_norm_only_on_boundaries():
    ring = rt.Ring(accumulate=2)
    model = jobs.small_model()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = jobs.regression_data(8).tensors
    ring.backward(F.cross_entropy(model(x), y) * 100)
    assert ring.clip_grad_norm_(model, 1.0) is None
    ring.backward(F.cross_entropy(model(x), y) * 100)
    norm = ring.clip_grad_norm_(model, 1.0)
    assert norm > 1.0
    clipped = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    assert clipped == pytest.approx(1.0, rel=1e-4)


def _two_optimizer_run(use_ring: bool, clip: bool, head_every: int = 1, steps: int = 5) -> tuple[torch.Tensor, float]:
    """fp16 on CPU with two models, two optimizers, one scaler: the ring's loop, or torch's
    documented one (scaler.step for each optimizer, then scaler.update once). The head's
    optimizer steps every ``head_every`` iterations (a GAN-like schedule)."""
    torch.manual_seed(0)
    encoder, head = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)
    opt_e = torch.optim.SGD(encoder.parameters(), lr=0.1)
    opt_h = torch.optim.SGD(head.parameters(), lr=0.1)
    data = torch.randn(steps, 4, 6)
    target = torch.randint(0, 3, (steps, 4))
    # growth_interval=1: the scale doubles after every finite step, so an update between
    # the two optimizers' steps shows as a factor of 2 in the second one's step.
    scaler_state = {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 1,
                    "_growth_tracker": 0}
    if use_ring:
        ring = rt.Ring(precision="16-mixed", device="cpu")
        encoder, opt_e = ring.setup(encoder, opt_e)
        head, opt_h = ring.setup(head, opt_h)
        ring._precision.scaler.load_state_dict(scaler_state)
        for i, (x, y) in enumerate(zip(data, target)):
            ring.backward(F.cross_entropy(head(encoder(x)), y))
            if clip:
                ring.clip_grad_norm_(encoder, 0.5)
            opt_e.step()
            if i % head_every == 0:
                opt_h.step()
            opt_e.zero_grad()
            opt_h.zero_grad()
        scale = ring._precision.scaler.get_scale()
        ring.close()
    else:
        scaler = torch.amp.GradScaler("cpu")
        scaler.load_state_dict(scaler_state)
        for i, (x, y) in enumerate(zip(data, target)):
            with torch.autocast("cpu", dtype=torch.float16):
                out = head(encoder(x)).float()
            scaler.scale(F.cross_entropy(out, y)).backward()
            if clip:
                scaler.unscale_(opt_e)
                scaler.unscale_(opt_h)
                torch.nn.utils.clip_grad_norm_(encoder.parameters(), 0.5)
            scaler.step(opt_e)
            if i % head_every == 0:
                scaler.step(opt_h)
            scaler.update()
            opt_e.zero_grad()
            opt_h.zero_grad()
        scale = scaler.get_scale()
    return torch.cat([p.detach().reshape(-1) for m in (encoder, head) for p in m.parameters()]), scale


@pytest.mark.parametrize("clip, head_every", [(False, 1), (True, 1), (True, 2)])
def test_fp16_scaler_with_two_optimizers_updates_once_per_step(clip, head_every):
    ringed, ring_scale = _two_optimizer_run(use_ring=True, clip=clip, head_every=head_every)
    reference, ref_scale = _two_optimizer_run(use_ring=False, clip=clip, head_every=head_every)
    assert ring_scale == ref_scale == 1024.0 * 2**5  # one update per step, not one per optimizer
    assert max_diff(ringed, reference) <= 1e-6
