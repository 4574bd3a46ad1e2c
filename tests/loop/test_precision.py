"""Mixed precision on CPU: autocast in forward, fp16 loss scaling, scaler checkpoints, accuracy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import _ring_jobs as jobs
import ringtrain as rt
from ringtrain.bench.datasets import digits
from ringtrain.bench.models import DigitsCNN

pytestmark = pytest.mark.timeout(300)


class DtypeProbe(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.seen = None

    def forward(self, x):
        out = self.fc(x)
        self.seen = out.dtype
        return out


@pytest.mark.parametrize("precision, inner", [("32", torch.float32), ("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)])
def test_forward_runs_under_autocast_and_returns_float32(precision, inner):
    ring = rt.Ring(precision=precision)
    model = ring.setup(DtypeProbe())
    out = model(torch.randn(3, 4))
    assert model.seen == inner
    assert out.dtype == torch.float32
    assert list(model.state_dict()) == ["fc.weight", "fc.bias"]


@pytest.mark.timeout(300)
def test_compiling_the_module_setup_returned_keeps_autocast():
    # torch.compile(ring.setup(model)): the order torch recommends for DDP-wrapped modules.
    # aot_eager runs dynamo and AOTAutograd (what breaks on the hooks) without a C compiler.
    torch.manual_seed(0)
    ring = rt.Ring(precision="bf16-mixed")
    eager = ring.setup(jobs.small_model())
    compiled_base = ring.setup(jobs.small_model())
    compiled_base.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_base, backend="aot_eager")
    x, y = jobs.regression_data(8).tensors
    for model in (eager, compiled):
        out = model(x)
        assert out.dtype == torch.float32
        F.cross_entropy(out, y).backward()
    assert torch.equal(compiled(x), eager(x))
    for a, b in zip(eager.parameters(), compiled_base.parameters()):
        assert torch.equal(a.grad, b.grad)
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")
@pytest.mark.parametrize("major, minor, ok", [(6, 1, False), (7, 5, False), (8, 0, True), (9, 0, True)])
def test_bf16_check_asks_the_devices_own_compute_capability(monkeypatch, major, minor, ok):
    # A GPU simulated by replacing the one CUDA query; the process runs on cuda:1, so asking
    # "the current device" (cuda:0 before set_device) would ask the wrong GPU.
    from types import SimpleNamespace

    from ringtrain.loop import precision as precision_module
    from ringtrain.bench.modes import precision_problem

    asked = []

    def cuda_properties(index):
        asked.append(index)
        return SimpleNamespace(name="Tesla T4" if not ok else "NVIDIA A100", major=major, minor=minor)

    monkeypatch.setattr(precision_module, "cuda_properties", cuda_properties, raising=False)
    device = torch.device("cuda", 1)
    if ok:
        assert precision_module.Precision("bf16-mixed", device).dtype is torch.bfloat16
        assert precision_problem("bf16-mixed", device) is None
    else:
        with pytest.raises(rt.RingtrainError, match=rf"Tesla T4 \(cuda:1, compute capability {major}.{minor}\)") as info:
            precision_module.Precision("bf16-mixed", device)
        assert "HINT: use precision='16-mixed'" in str(info.value)
        assert "compute capability" in precision_problem("bf16-mixed", device)
    assert asked and set(asked) == {1}
    asked.clear()
    precision_module.Precision("16-mixed", device)  # float16 needs no capability check
    assert asked == []


def test_autocast_region_closes_when_forward_raises():
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    ring = rt.Ring(precision="bf16-mixed")
    model = ring.setup(Boom())
    with pytest.raises(ValueError):
        model(torch.randn(1))
    assert not torch.is_autocast_enabled("cpu")


def test_bf16_mixed_trains_digits_to_95_percent():
    torch.manual_seed(0)
    ring = rt.Ring(seed=0, precision="bf16-mixed")
    train_set, test_set = digits()
    model = DigitsCNN()
    model, optimizer = ring.setup(model, torch.optim.Adam(model.parameters(), lr=2e-3))
    train = ring.loader(train_set, batch_size=32, shuffle=True)
    for _ in ring.epochs(6):
        for x, y in train:
            ring.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    x, y = test_set.tensors
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    assert accuracy >= 0.95


def test_fp16_inf_gradient_skips_the_step_and_training_recovers():
    ring = rt.Ring(precision="16-mixed")
    model = jobs.small_model()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = jobs.regression_data(16).tensors
    scale_before = ring._precision.scaler.get_scale()
    before = jobs.flat_params(model)
    ring.backward(F.cross_entropy(model(x), y))
    next(model.parameters()).grad[0, 0] = float("inf")  # injected overflow
    optimizer.step()
    optimizer.zero_grad()
    assert torch.equal(before, jobs.flat_params(model)), "a step with inf gradients must be skipped"
    assert ring._precision.scaler.get_scale() == scale_before / 2
    ring.backward(F.cross_entropy(model(x), y))
    optimizer.step()
    assert not torch.equal(before, jobs.flat_params(model))
    assert torch.isfinite(jobs.flat_params(model)).all()


def test_scaler_state_survives_save_and_load(tmp_path):
    ring = rt.Ring(precision="16-mixed")
    model = jobs.small_model()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = jobs.regression_data(16).tensors
    ring.backward(F.cross_entropy(model(x), y))
    next(model.parameters()).grad[0, 0] = float("nan")
    optimizer.step()
    scale = ring._precision.scaler.get_scale()
    ring.save(str(tmp_path / "amp.pt"), model=model, optimizer=optimizer)

    other = rt.Ring(precision="16-mixed")
    model2 = jobs.small_model()
    model2, optimizer2 = other.setup(model2, torch.optim.SGD(model2.parameters(), lr=0.1))
    assert other._precision.scaler.get_scale() != scale
    other.load(str(tmp_path / "amp.pt"), model=model2, optimizer=optimizer2)
    assert other._precision.scaler.get_scale() == scale


def test_fp16_clip_unscales_first():
    x, y = jobs.regression_data(16).tensors
    norms = {}
    for precision in ("32", "16-mixed"):
        ring = rt.Ring(precision=precision)
        model = jobs.small_model()
        model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        ring.backward(F.cross_entropy(model(x), y))
        norms[precision] = ring.clip_grad_norm_(model, 1e9).item()
        optimizer.step()
    assert norms["16-mixed"] == pytest.approx(norms["32"], rel=2e-2)


def test_unknown_precision():
    with pytest.raises(rt.RingtrainError, match="unknown precision"):
        rt.Ring(precision="8-mixed")


def test_seed_same_before_setup_distinct_after(run_ranks):
    (b0, a0), (b1, a1) = run_ranks(jobs.seeded_streams)
    assert torch.equal(b0, b1)
    assert not torch.equal(a0, a1)


def test_deterministic_switch():
    try:
        rt.Ring(deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
