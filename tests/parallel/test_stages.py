"""ringtrain.parallel.stages: one process, stages on several devices, equal to the unsplit model."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ringtrain as rt
from ringtrain.parallel.stages import Split, cut, cuttable_names, meta_shapes, split

pytestmark = pytest.mark.timeout(240)

needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 or more CUDA GPUs")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def nested_model() -> nn.Sequential:
    torch.manual_seed(0)
    body = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.ReLU())
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), body, nn.Dropout(0.5), nn.Linear(8, 3))


def data(n: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}


def assert_close(a: dict, b: dict, tol: float) -> None:
    assert list(a) == list(b)
    for k, value in a.items():
        assert torch.allclose(value.cpu(), b[k].cpu(), atol=tol, rtol=0), k


@pytest.mark.parametrize("microbatches", [None, 3])
@pytest.mark.parametrize("at", [["2"], ["2.2", "4"]])
def test_split_equals_unsplit_outputs_and_grads(at, microbatches):
    model = nested_model().eval()  # dropout off: same function on both sides
    unsplit = copy.deepcopy(model)
    cut = split(model, devices=["cpu"] * (len(at) + 1), at=at, microbatches=microbatches)
    x, y = data(10)  # 10 rows in 3 micro-batches: uneven chunks are fine in one process
    out, ref = cut(x), unsplit(x)
    assert (out - ref).abs().max() <= 1e-6
    F.cross_entropy(out, y).backward()
    F.cross_entropy(ref, y).backward()
    assert_close(grads(cut), grads(unsplit), 1e-6)


def test_state_dict_is_the_unsplit_models_and_loads_both_ways():
    model = nested_model()
    keys = list(model.state_dict())
    cut = split(model, devices=["cpu", "cpu", "cpu"], at=["2.1", "4"])
    assert list(cut.state_dict()) == keys
    # The stages' own state dicts partition the unsplit one, under the same names.
    assert [k for s in cut.stages for k in s.state_dict()] == keys
    fresh = nested_model()
    for p in fresh.parameters():
        nn.init.zeros_(p)
    fresh.load_state_dict(cut.state_dict())  # split -> unsplit
    assert_close(fresh.state_dict(), cut.state_dict(), 0)
    torch.manual_seed(5)
    trained = nn.Sequential(*[copy.deepcopy(m) for m in nested_model()])
    for p in trained.parameters():
        nn.init.normal_(p)
    other = split(nested_model(), devices=["cpu", "cpu"], at=["3"])
    other.load_state_dict(trained.state_dict())  # unsplit -> split
    assert_close(other.state_dict(), trained.state_dict(), 0)
    assert torch.equal(other.stages[1][1].weight, trained[4].weight)


def test_training_loop_matches_unsplit_with_microbatches():
    model = nested_model()
    model[3] = nn.Identity()  # no dropout: both runs must draw nothing random
    unsplit = copy.deepcopy(model)
    cut = split(model, devices=["cpu", "cpu"], at=["2.2"], microbatches=4)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (cut, unsplit)]
    for step in range(3):
        x, y = data(16)
        for m, opt in zip((cut, unsplit), opts):
            F.cross_entropy(m(x), y).backward()
            opt.step()
            opt.zero_grad()
    assert_close(cut.state_dict(), unsplit.state_dict(), 1e-6)


def test_train_and_eval_reach_every_stage():
    cut = split(nested_model(), devices=["cpu", "cpu"], at=["3"])
    x, _ = data(4)
    cut.eval()
    assert torch.equal(cut(x), cut(x))  # dropout (in stage 1) is off
    cut.train()
    assert all(m.training for s in cut.stages for m in s.modules())


def test_list_of_stages():
    torch.manual_seed(0)
    first, second = nn.Sequential(nn.Linear(6, 5), nn.ReLU()), nn.Linear(5, 2)

    class TwoOut(nn.Module):  # a stage returning a tuple: the next stage gets its items as arguments
        def forward(self, x):
            return x, x * 2

    class TwoIn(nn.Module):
        def forward(self, a, b):
            return a + b

    cut = split([first, TwoOut(), TwoIn(), second], devices=["cpu"] * 4, microbatches=2)
    x, _ = data(6)
    assert torch.allclose(cut(x), second(3 * first(x)), atol=1e-6)
    assert list(cut.state_dict()) == list(nn.ModuleList([first, TwoOut(), TwoIn(), second]).state_dict())


def test_cuttable_names_lists_sequential_paths():
    assert cuttable_names(nested_model()) == ["0", "1", "2", "2.0", "2.1", "2.2", "2.3", "3", "4"]


def test_meta_shapes_cost_nothing_and_touch_nothing():
    model = nested_model()
    model.insert(1, nn.BatchNorm1d(8))
    stages, _ = cut(model, ["3"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    shapes = meta_shapes(stages, torch.randn(5, 6))
    assert [tuple(o.shape) for _, outs in shapes for o in outs] == [(5, 8), (5, 3)]
    assert all(t.device.type == "meta" for ins, outs in shapes for t in (*ins, *outs))
    assert_close(model.state_dict(), before, 0)  # BatchNorm's running statistics untouched

    class KeepPositive(nn.Module):
        def forward(self, x):
            return x[x[:, 0] > 0]

    assert meta_shapes(cut(nn.Sequential(nn.Linear(6, 4), KeepPositive(), nn.Linear(4, 2)), ["2"])[0], torch.randn(5, 6)) is None


def test_unknown_split_name_lists_available_names():
    with pytest.raises(rt.RingtrainError, match="layer9") as info:
        split(nested_model(), devices=["cpu", "cpu"], at=["layer9"])
    assert "HINT:" in str(info.value) and "2.1" in str(info.value)


def test_errors_name_the_fix():
    with pytest.raises(rt.RingtrainError, match="one device per stage"):
        split(nested_model(), devices=["cpu"], at=["2"])
    with pytest.raises(rt.RingtrainError, match="without any module"):
        split(nested_model(), devices=["cpu", "cpu"], at=["0"])
    with pytest.raises(rt.RingtrainError, match="either the stages as a list"):
        split([nn.Linear(2, 2), nn.Linear(2, 2)], at=["0"])

    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

        def forward(self, x):
            return self.b(self.a(x).flatten(1))

    with pytest.raises(rt.RingtrainError, match="own forward") as info:
        split(Custom(), devices=["cpu", "cpu"], at=["b"])
    assert "nn.Sequential" in info.value.hint
    with pytest.raises(rt.RingtrainError, match="microbatches"):
        split(nested_model(), devices=["cpu", "cpu"], at=["2"], microbatches=0)


def test_returns_a_module_that_is_the_split():
    cut = split(nested_model(), devices=["cpu", "cpu"], at=["2"])
    assert isinstance(cut, Split) and isinstance(cut, nn.Module)
    assert len(list(cut.parameters())) == len(list(nested_model().parameters()))


@needs_two_gpus
@pytest.mark.gpu
def test_split_across_two_gpus():
    model = nested_model().eval()
    unsplit = copy.deepcopy(model).cuda(0)
    cut = split(model, devices=["cuda:0", "cuda:1"], at=["2.2"], microbatches=4)
    assert {p.device for p in cut.stages[1].parameters()} == {torch.device("cuda", 1)}
    x, y = data(16)
    out = cut(x.cuda(0))
    assert out.device == torch.device("cuda", 1)
    F.cross_entropy(out, y.cuda(1)).backward()
    ref = unsplit(x.cuda(0))
    F.cross_entropy(ref, y.cuda(0)).backward()
    assert (out.cpu() - ref.cpu()).abs().max() <= 1e-5
    assert_close(grads(cut), grads(unsplit), 1e-5)


@needs_gpu
@pytest.mark.gpu
def test_split_between_cpu_and_gpu():
    model = nested_model().eval()
    unsplit = copy.deepcopy(model)
    cut = split(model, devices=["cpu", "cuda:0"], at=["2.2"], microbatches=2)
    x, y = data(8)
    out = cut(x)
    assert out.device.type == "cuda"
    F.cross_entropy(out, y.cuda()).backward()
    F.cross_entropy(unsplit(x), y).backward()
    assert_close(grads(cut), grads(unsplit), 1e-5)
    assert list(cut.state_dict()) == list(unsplit.state_dict())


def test_integer_split_points_of_a_sequential():
    # What users write for nn.Sequential: positions, not names.
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    by_position = rt.split(model, devices=["cpu", "cpu"], at=[2])
    assert [list(dict(stage.named_children())) for stage in by_position.stages] == [["0", "1"], ["2"]]
    assert rt.split(model, devices=["cpu", "cpu"], at=2).stages[1][0] is model[2]


def test_ring_setup_keeps_a_split_models_placement():
    # ring.setup moved every module to ring.device, collapsing a split model onto one device.
    # "meta" stands in for a second device on a CPU machine: where the stage is, not what it computes.
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    split = rt.split(model, devices=["cpu", "meta"], at=[2])
    ring = rt.Ring()
    placed = ring.setup(split)
    assert placed is split
    assert {p.device.type for p in split.stages[0].parameters()} == {"cpu"}
    assert {p.device.type for p in split.stages[1].parameters()} == {"meta"}
