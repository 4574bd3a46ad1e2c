"""comm/powersgd.py: which gradients are compressed (the rate rule), exactness at full rank, error
feedback (what is missed now arrives later), Q seeded by name and seed (never by rank), warm start,
start_step, non-finite steps not poisoning the state, the state keyed by parameter name through
save and load, the hook's worker thread, and the options' refusals. A real one-rank Gloo group runs
the all-reduces (dividing by a world size of 1)."""

from __future__ import annotations

import copy

import pytest
import torch

from ringtrain.comm import ddp_hooks, powersgd
from ringtrain.comm.powersgd import PowerSGD, PowerSGDHook
from ringtrain.errors import RingtrainError


def hook(names=None, **options) -> PowerSGDHook:
    return PowerSGDHook(PowerSGD(**options), names or {}, None)


def matrix(rows, cols, seed=0):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def step(state: PowerSGDHook, params, grads, last=True):
    buffer = torch.cat([g.flatten() for g in grads])
    state._reduce(buffer, params, grads, last)
    return grads


@pytest.mark.parametrize("shape, rank, rate, want", [
    ((8,), 1, 2.0, None),  # a vector: whole
    ((3, 3), 1, 2.0, None),  # (3 + 3) x 1 x 2 = 12 > 9
    ((4, 4), 1, 2.0, (4, 4)),  # 16 <= 16
    ((8, 8), 4, 2.0, None),  # (8 + 8) x 4 x 2 = 128 > 64
    ((8, 2, 3, 3), 1, 2.0, (8, 18)),  # a conv weight: rows x the rest
    ((2, 2), 1, 0.0, (2, 2)),  # rate 0: every matrix
], ids=str)
def test_a_matrix_is_compressed_only_when_it_shrinks_enough(engine, shape, rank, rate, want):
    assert hook(rank=rank, min_compression_rate=rate)._matrix_shape(torch.zeros(shape)) == want


def test_full_rank_gives_the_gradient_back_and_counts_two_all_reduces(engine):
    w, b = torch.nn.Parameter(torch.zeros(6, 4)), torch.nn.Parameter(torch.zeros(4))
    state = hook({w: "layer.weight", b: "layer.bias"}, rank=8, min_compression_rate=0)
    g, bias = matrix(6, 4), torch.tensor([1.0, -2.0, 3.0, 0.5])
    out = step(state, [w, b], [g.clone(), bias.clone()])
    assert torch.allclose(out[0], g, atol=1e-5) and torch.equal(out[1], bias)  # the bias travels whole
    assert state.error["layer.weight"].abs().max() < 1e-5
    # P^T: r x rows = 4 x 6 and the whole bias (4) in the first all-reduce; Q^T: 4 x 4 in the second
    assert (state.calls, state.sent_last_step) == (2, (24 + 4 + 16) * 4)
    assert sorted(state.q) == ["layer.weight"] and state.steps == 1


def test_what_low_rank_misses_is_kept_and_sent_later(engine):
    w = torch.nn.Parameter(torch.zeros(6, 4))
    state = hook({w: "w"}, rank=1)  # (6 + 4) x 1 x 2 <= 24: compressed
    g = matrix(6, 4, seed=1)
    first = step(state, [w], [g.clone()])[0]
    assert torch.linalg.matrix_rank(first) == 1
    assert torch.allclose(first + state.error["w"], g, atol=1e-6)  # approximation + error feedback = gradient
    second = step(state, [w], [torch.zeros(6, 4)])[0]  # no new gradient: the kept error travels
    assert second.abs().max() > 0.01
    assert (g - first - second).norm() < (g - first).norm()
    assert state.q["w"].shape == (1, 4) and state.steps == 2


def test_q_is_seeded_by_name_and_seed_never_by_rank_and_has_orthonormal_rows(engine):
    a, b = hook(rank=3), hook(rank=3)
    q = a._qt("layer.weight", 7, torch.device("cpu"))
    assert torch.equal(q, b._qt("layer.weight", 7, torch.device("cpu")))  # what every rank computes
    assert not torch.equal(q, hook(rank=3)._qt("other.weight", 7, torch.device("cpu")))
    assert not torch.equal(q, hook(rank=3, seed=1)._qt("layer.weight", 7, torch.device("cpu")))
    assert q.shape == (3, 7) and torch.allclose(q @ q.t(), torch.eye(3), atol=1e-6)
    assert a._qt("tiny", 2, torch.device("cpu")).shape == (2, 2)  # at most as many rows as columns


@pytest.mark.parametrize("warm", [True, False])
def test_warm_start_keeps_last_steps_q(engine, warm):
    w = torch.nn.Parameter(torch.zeros(10, 8))
    state = hook({w: "w"}, rank=2, warm_start=warm)
    fresh = hook(rank=2)._qt("w", 8, torch.device("cpu"))
    step(state, [w], [matrix(10, 8)])
    assert torch.equal(state.q["w"], fresh) is (not warm)


def test_start_step_all_reduces_plainly_first(engine):
    w = torch.nn.Parameter(torch.zeros(8, 8))
    state = hook({w: "w"}, rank=1, start_step=2)
    g = matrix(8, 8)
    for n in range(2):
        assert torch.equal(step(state, [w], [g.clone()])[0], g)  # divided by a world size of 1
        assert state.sent_last_step == 64 * 4 and state.q == {} and state.steps == n + 1
    step(state, [w], [g.clone()])
    assert state.sent_last_step == (8 + 8) * 4 and "w" in state.q


def test_a_step_ends_with_its_last_bucket(engine):
    w, v = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(2))
    state = hook({w: "w", v: "v"})
    step(state, [w], [torch.ones(4)], last=False)
    assert (state.steps, state.sent, state.sent_last_step) == (0, 16, 0)
    step(state, [v], [torch.ones(2)], last=True)
    assert (state.steps, state.sent, state.sent_last_step, state.total) == (1, 0, 24, 24)


def test_a_non_finite_step_does_not_poison_the_kept_state(engine):
    w = torch.nn.Parameter(torch.zeros(6, 4))
    state = hook({w: "w"}, rank=1)
    step(state, [w], [matrix(6, 4)])
    q = state.q["w"].clone()
    assert "w" in state.error
    bad = matrix(6, 4, seed=2)
    bad[0, 0] = float("inf")
    step(state, [w], [bad])
    assert "w" not in state.error and torch.equal(state.q["w"], q)


def test_the_state_is_keyed_by_name_and_survives_save_and_load(engine):
    w = torch.nn.Parameter(torch.zeros(6, 4))
    state = hook({w: "layer.weight"}, rank=1)
    step(state, [w], [matrix(6, 4)])
    saved = copy.deepcopy(state.state_dict())  # as the checkpoint file gives it back (its own tensors)
    assert saved["steps"] == 1 and list(saved["q"]) == ["layer.weight"] and list(saved["error"]) == ["layer.weight"]
    again = hook({w: "layer.weight"}, rank=1)
    again.load_state_dict(saved)
    assert again.steps == 1 and torch.equal(again.q["layer.weight"], state.q["layer.weight"])
    assert torch.equal(again.error["layer.weight"], state.error["layer.weight"])
    g = matrix(6, 4, seed=3)
    assert torch.equal(step(again, [w], [g.clone()])[0], step(state, [w], [g.clone()])[0])  # continues exactly
    other_world = hook({w: "layer.weight"}, rank=1)
    other_world.load_state_dict(saved, error=False)
    assert other_world.error == {} and other_world.steps == 1 and "layer.weight" in other_world.q
    empty = hook()
    empty.load_state_dict({})
    assert (empty.steps, empty.q, empty.error) == (0, {}, {})


class Bucket:
    """What DDP hands a comm hook (``dist.GradBucket``'s methods)."""

    def __init__(self, params, grads, last=True):
        self.params, self.grads, self.last = params, grads, last

    def buffer(self):
        return torch.cat([g.flatten() for g in self.grads]) if None not in self.grads else torch.zeros(4)

    def parameters(self):
        return self.params

    def gradients(self):
        return self.grads

    def is_last(self):
        return self.last


def test_the_hook_hands_buckets_to_one_worker_thread_in_order(engine):
    w = torch.nn.Parameter(torch.zeros(4))
    state = hook({w: "w"})
    futures = [PowerSGDHook.hook(state, Bucket([w], [torch.full((4,), float(i))], last=i == 2)) for i in range(3)]
    assert [f.wait().tolist() for f in futures] == [[float(i)] * 4 for i in range(3)]
    assert state.steps == 1 and state.calls == 3
    broken = PowerSGDHook.hook(state, Bucket([w], [None]))
    with pytest.raises(Exception):
        broken.wait()  # the worker's error reaches DDP (then backward), it does not kill the worker
    assert PowerSGDHook.hook(state, Bucket([w], [torch.ones(4)])).wait().tolist() == [1.0] * 4


def test_under_ddp_the_state_is_keyed_by_the_models_parameter_names(engine):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state, fn = ddp_hooks.make_hook(PowerSGD(rank=1), model, None)
    ddp.register_comm_hook(state, fn)
    for _ in range(2):
        ddp(torch.randn(4, 8)).sum().backward()
    assert state.steps == 2 and sorted(state.q) == sorted(state.error) == ["0.weight"]
    # 0.weight (8 x 8) compressed: P^T 1 x 8 + Q^T 1 x 8; 1.weight (2 x 8: 10 x 2 > 16) and the biases whole
    assert state.sent_last_step == (8 + 8 + 8 + 16 + 2) * 4 and state.calls == 4


@pytest.mark.parametrize("make, says", [
    (lambda: PowerSGD(seed=-1), "PowerSGD got seed=-1"),
    (lambda: PowerSGD(rank=True), "PowerSGD got rank=True"),
    (lambda: PowerSGD(rank=2.0), "PowerSGD got rank=2.0"),
    (lambda: PowerSGD(min_compression_rate=-0.5), "PowerSGD got min_compression_rate=-0.5"),
])
def test_options_not_covered_by_the_ddp_tests_are_refused(make, says):
    with pytest.raises(RingtrainError, match="HINT") as error:
        make()
    assert says in str(error.value)


def test_options_are_kept_as_given():
    options = PowerSGD(4, start_step=10, min_compression_rate=3, warm_start=0, seed=7)
    assert (options.rank, options.start_step, options.min_compression_rate, options.warm_start, options.seed) == \
           (4, 10, 3.0, False, 7)
    assert repr(options) == "PowerSGD(rank=4, start_step=10)"
    assert powersgd._orthonormal(torch.eye(3) * 2).abs().tolist() == torch.eye(3).tolist()
