"""comm/grad_sync.py: the fusion buckets (reverse definition order, by dtype, the 1 MiB first bucket,
the threshold, explicit groups), each bucket launched once complete and strictly in order, the
"had a gradient" flags, backward_passes_per_step, compression on the wire, prescale / postscale,
sparse gradients, a layout checked once (and a rank with another model refused before any bucket
moves), a retired sync, and what a joined rank mirrors. The engine is a real one-rank Gloo group
where a set of two is played from rank 0 (so an Average halves: the other rank's part is zeros);
the flags across two real ranks come from the one 2-rank job."""

from __future__ import annotations

import _comm_jobs as jobs
import pytest
import torch
import torch.distributed as dist
from _comm_util import EngineSpy, Member, post_row

from ringtrain.comm import checks, grad_sync, store_check
from ringtrain.comm.compression import FP16Compressor
from ringtrain.comm.grad_sync import GradientSync, plan_buckets
from ringtrain.comm.groups import ProcessSet
from ringtrain.comm.ops import ReduceOp
from ringtrain.comm.store_check import StoreRows
from ringtrain.errors import RingtrainError


def params(*sizes, dtype=torch.float32):
    return [torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n in sizes]


def ids(buckets):
    return [[id(p) for p in b] for b in buckets]


# --- planning ---------------------------------------------------------------------------------------
def test_buckets_take_parameters_in_reverse_order_split_by_dtype():
    p = params(100, 300) + params(10, dtype=torch.float64) + params(50)
    assert ids(plan_buckets(p, 1 << 26)) == ids([[p[3], p[1], p[0]], [p[2]]])


def test_the_first_bucket_is_cut_at_1_mib_the_others_at_the_threshold():
    small_a, small_b, big = params(10, 10, 300_000)  # 1.2 MB of float32, last defined: its gradient comes first
    assert ids(plan_buckets([small_a, small_b, big], 1 << 26)) == ids([[big], [small_b, small_a]])
    p = params(100, 100, 100, 100, 100)  # 400 bytes each; a bucket closes once it reaches 1000
    assert ids(plan_buckets(p, 1000)) == ids([[p[4], p[3], p[2]], [p[1], p[0]]])


def test_a_threshold_of_0_is_one_parameter_per_bucket():
    p = params(1, 2, 3)
    assert ids(plan_buckets(p, 0)) == ids([[p[2]], [p[1]], [p[0]]])


def test_explicit_groups_come_first_split_by_dtype_and_the_rest_by_threshold():
    p = params(4, 4, 4, 4)
    half = params(4, dtype=torch.float16)[0]
    stranger = params(4)[0]  # not among the synced parameters: ignored
    buckets = plan_buckets(p + [half], 1 << 26, groups=[[p[0], p[2], half, stranger]])
    assert ids(buckets) == ids([[p[0], p[2]], [half], [p[3], p[1]]])


def test_a_bucket_packs_missing_gradients_as_zeros_with_their_flag_0():
    a, b, c = params(2, 1, 2)
    a.grad, c.grad = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
    bucket = grad_sync._Bucket([a, b, c])
    bucket.pack()
    assert bucket.payload.tolist() == [1.0, 2.0, 0.0, 3.0, 4.0]
    assert bucket.flags.tolist() == [1.0, 0.0, 1.0, 1.0]  # per parameter, then "this rank stepped"
    b.grad = torch.tensor([5.0])
    bucket.pack()
    assert bucket.buffer.tolist() == [1.0, 2.0, 5.0, 3.0, 4.0, 1.0, 1.0, 1.0, 1.0]


# --- one process ------------------------------------------------------------------------------------
def test_alone_no_hooks_and_synchronize_leaves_gradients_as_they_are():
    model = torch.nn.Linear(2, 1)
    frozen = torch.nn.Parameter(torch.ones(3), requires_grad=False)
    sync = GradientSync([*model.parameters(), model.weight, frozen], process_set=ProcessSet(None))
    assert sync._hooks == [] and len(sync.params) == 2  # the repeat and the frozen one are not synced
    assert sync.layout == "AVERAGE 1.0 1.0 NoneCompressor torch.float32 [(1,), (1, 2)]"
    assert sync.layout_hash == checks.hash_text(sync.layout)
    model(torch.ones(1, 2)).sum().backward()
    sync.synchronize()
    assert model.weight.grad.tolist() == [[1.0, 1.0]] and model.bias.grad.tolist() == [1.0]


@pytest.mark.parametrize("passes", [0, -1, 1.0, "2"])
def test_backward_passes_per_step_must_be_a_positive_integer(passes):
    with pytest.raises(RingtrainError) as error:
        GradientSync(params(1), process_set=ProcessSet(None), backward_passes_per_step=passes)
    assert error.value.message == f"backward_passes_per_step={passes!r}"
    assert error.value.hint == "use a positive integer (1 = no accumulation)."


def test_adasum_gradients_are_not_synced_here():
    with pytest.raises(AssertionError, match="delta optimizer"):
        GradientSync(params(1), process_set=ProcessSet(None), op=ReduceOp.ADASUM)


# --- a set of two, played by this rank on a one-rank engine ------------------------------------------
def two_layers():
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"first": torch.nn.Linear(2, 2), "second": torch.nn.Linear(2, 1)})


X = torch.tensor([[1.0, 2.0], [3.0, -1.0]])


def local_grads(model, loss_fn):
    """The gradients of ``loss_fn`` on a copy of the model, by plain autograd."""
    twin = two_layers()
    twin.load_state_dict(model.state_dict())
    loss_fn(twin).backward()
    return {n: None if p.grad is None else p.grad.clone() for n, p in twin.named_parameters()}


def full(m):
    return m["second"](torch.relu(m["first"](X))).sum()


def test_each_bucket_starts_in_backward_once_complete_in_order(monkeypatch, engine):
    spy = EngineSpy(monkeypatch, "all_reduce")
    model = two_layers()
    sync = GradientSync(model.parameters(), process_set=Member([0, 1], 0), fusion_threshold=0, check=False)
    want = local_grads(model, full)
    full(model).backward()
    # buckets: second.bias, second.weight, first.bias, first.weight — each numel + its flag + "stepped"
    assert spy.shapes() == [(torch.float32, 3), (torch.float32, 4), (torch.float32, 4), (torch.float32, 6)]
    assert sync.pending and all(b.pending is not None for b in sync.buckets)
    sync.synchronize()
    assert len(spy.calls) == 4 and not sync.pending
    for name, p in model.named_parameters():
        assert torch.equal(p.grad, want[name] / 2), name  # averaged over 2 (the other rank's part: zeros)


def test_a_bucket_waits_for_the_ones_before_it_and_unused_parameters_stay_none(monkeypatch, engine):
    spy = EngineSpy(monkeypatch, "all_reduce")
    model = two_layers()
    sync = GradientSync(model.parameters(), process_set=Member([0, 1], 0), fusion_threshold=0, check=False)
    only_first = lambda m: m["first"](X).sum()  # noqa: E731 - "second" gets no gradient
    want = local_grads(model, only_first)
    only_first(model).backward()
    assert spy.calls == []  # first.* are complete, but the buckets of second.* come first
    sync.synchronize()
    assert spy.shapes() == [(torch.float32, 3), (torch.float32, 4), (torch.float32, 4), (torch.float32, 6)]
    assert model["second"].weight.grad is None and model["second"].bias.grad is None  # no rank had one
    assert torch.equal(model["first"].weight.grad, want["first.weight"] / 2)


def test_accumulated_passes_are_reduced_after_the_last_and_one_more_is_refused(monkeypatch, engine):
    spy = EngineSpy(monkeypatch, "all_reduce")
    model = two_layers()
    sync = GradientSync(model.parameters(), process_set=Member([0, 1], 0), backward_passes_per_step=2, check=False)
    want = local_grads(model, full)
    full(model).backward()
    assert spy.calls == [] and sync.pending
    full(model).backward()
    assert len(spy.calls) == 1  # one fused bucket, started by the second pass
    with pytest.raises(RingtrainError) as error:
        full(model).backward()
    assert error.value.message == ("gradients were computed more than backward_passes_per_step=2 times before "
                                   "optimizer.step()")
    assert "raise backward_passes_per_step to the number of backward passes you accumulate" in error.value.hint
    sync.abandon()
    assert not sync.pending and all(b.pending is None for b in sync.buckets)
    for p in model.parameters():
        p.grad = None
    full(model).backward()
    full(model).backward()
    sync.synchronize()
    assert torch.equal(model["first"].weight.grad, want["first.weight"])  # (g + g) / 2


def test_fp16_buckets_travel_as_float16_and_come_back_float32(monkeypatch, engine):
    spy = EngineSpy(monkeypatch, "all_reduce")
    model = torch.nn.Linear(3, 1)
    sync = GradientSync(model.parameters(), process_set=Member([0, 1], 0), compression=FP16Compressor, check=False)
    x = torch.tensor([[1 / 3, 0.1, 7.0]])
    model(x).sum().backward()
    assert spy.shapes() == [(torch.float16, 1 + 3 + 2 + 1)]
    assert sync.wire_spec() == [(7, torch.float16, torch.device("cpu"), dist.ReduceOp.SUM)]
    sync.synchronize()
    assert model.weight.grad.dtype == torch.float32
    assert torch.equal(model.weight.grad, x.half().float() / 2) and model.bias.grad.tolist() == [0.5]


def test_prescale_before_and_postscale_after_the_sum(monkeypatch, engine):
    model = torch.nn.Linear(2, 1)
    sync = GradientSync(model.parameters(), process_set=Member([0, 1], 0), op=ReduceOp.SUM, prescale=3.0,
                        postscale=0.5, check=False)
    model(torch.tensor([[1.0, 2.0]])).sum().backward()
    sync.synchronize()
    assert model.weight.grad.tolist() == [[1.5, 3.0]] and model.bias.grad.tolist() == [1.5]


def test_sparse_gradients_are_reduced_dense_and_come_back_sparse(engine):
    emb = torch.nn.Embedding(4, 2, sparse=True)
    sync = GradientSync(emb.parameters(), process_set=Member([0, 1], 0), check=False)
    emb(torch.tensor([1, 3, 1])).sum().backward()
    sync.synchronize()
    assert emb.weight.grad.is_sparse
    assert emb.weight.grad.to_dense().tolist() == [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.5, 0.5]]


def test_wrapping_the_parameters_again_retires_the_older_sync(engine):
    model = torch.nn.Linear(2, 1)
    ps = Member([0, 1], 0)
    old = GradientSync(model.parameters(), process_set=ps, check=False)
    new = GradientSync(model.parameters(), process_set=ps, check=False)
    assert old.detached and old._hooks == [] and not new.detached
    model(torch.ones(1, 2)).sum().backward()
    assert old._next == 0 and new._next == 1  # only the newer one's hooks fired
    new.synchronize()
    with pytest.raises(RingtrainError) as error:
        old.synchronize()
    assert "were wrapped again by a newer DistributedOptimizer, which now reduces their gradients" in str(error.value)
    assert "HINT: step the newest DistributedOptimizer" in str(error.value)


# --- the layout check, with a scripted peer -----------------------------------------------------------
def test_a_layout_is_checked_once_then_steps_send_no_check(engine):
    store = dist.HashStore()
    ps = Member([0, 1], 0, StoreRows(store, 5.0))
    model = torch.nn.Linear(2, 1)
    sync = GradientSync(model.parameters(), process_set=ps)
    post_row(store, 1, 1, sync._layout_call())  # the peer has the same model
    for step in range(3):
        model(torch.ones(1, 2)).sum().backward()
        sync.synchronize()
        assert ps.check_rounds == 1 and ps.grad_steps == step + 1
    assert ps.grad_layout == (sync.layout_hash, sync.wire_spec())
    assert not store.check(["check/2/0"])


def test_a_rank_with_another_model_is_refused_before_any_bucket_moves(monkeypatch, engine):
    spy = EngineSpy(monkeypatch, "all_reduce")
    store = dist.HashStore()
    ps = Member([0, 1], 0, StoreRows(store, 5.0))
    model = torch.nn.Linear(2, 1)
    sync = GradientSync(model.parameters(), process_set=ps)
    theirs = GradientSync(torch.nn.Linear(3, 2).parameters(), process_set=ProcessSet(None))
    post_row(store, 1, 1, theirs._layout_call())
    with pytest.raises(RingtrainError) as error:
        model(torch.ones(1, 2)).sum().backward()  # the bucket completes in backward: checked there
    assert error.value.message == ("collective #1 differs across ranks: rank 0 called grad_sync(float32[3], "
                                   "op=Average, 1 bucket(s)); rank 1 called grad_sync(float32[8], op=Average, "
                                   "1 bucket(s))")
    assert error.value.hint == store_check.HINT_DIFFERENT
    assert spy.calls == [] and ps.grad_layout is None


def test_a_joined_rank_finds_the_wire_spec_of_its_own_sync_by_hash(monkeypatch, engine):
    ps = Member([0, 1], 0)
    model = torch.nn.Linear(2, 1)
    sync = GradientSync(model.parameters(), process_set=ps, check=False)
    assert grad_sync.spec_of(ps, sync.layout_hash) == [(3 + 2 + 1, torch.float32, torch.device("cpu"),
                                                        dist.ReduceOp.SUM)]
    with pytest.raises(RingtrainError) as error:
        grad_sync.spec_of(ps, sync.layout_hash + 1)
    assert "the other ranks are synchronising gradients of a DistributedOptimizer that this rank does not have" in \
           str(error.value)
    assert "HINT: create the same DistributedOptimizer (same model) on every rank before any rank joins." in \
           str(error.value)
    spy = EngineSpy(monkeypatch, "all_reduce")
    grad_sync.flush(sync.wire_spec(), ps)  # the zero buckets a joined rank keeps posted, completed
    assert spy.shapes() == [(torch.float32, 6)] and torch.count_nonzero(spy.calls[0]["values"]) == 0


# --- two real ranks --------------------------------------------------------------------------------
@pytest.mark.timeout(90)
def test_on_two_ranks_a_gradient_on_one_rank_only_is_averaged_with_zeros(two_ranks):
    # a: both ranks; b: rank 1 only; unused: neither. batch r = [[1, 2], [3, 4]] * (r + 1), loss = sum
    for res in two_ranks:
        g = res["grads"]
        assert g["a.weight"].tolist() == [[6.0, 9.0]] and g["a.bias"].tolist() == [2.0]  # ([4, 6] + [8, 12]) / 2
        assert g["b.weight"].tolist() == [[4.0, 6.0]] and g["b.bias"].tolist() == [1.0]  # ([0, 0] + [8, 12]) / 2
        assert g["unused.weight"] is None and g["unused.bias"] is None
        assert res["grad_rounds"] == [1, 0]  # the layout checked at the first step only
    assert jobs.batch(1).tolist() == [[2.0, 4.0], [6.0, 8.0]]
