"""Horovod's semantics that its own test_torch.py checks (issue 11), against values computed
here with plain torch on one process.

* async ops paired by name whatever order ranks submit them in; a name reused while in
  flight is a ValueError; waits nobody can satisfy raise on every rank;
* ``sparse_allreduce_async`` returns a callable; sparse gradients stay sparse;
* alltoall's argument rules and ValueErrors; default parameter names;
* ``join``: only the ops of the ranks that have not joined fail; it returns the last rank to
  join; joined ranks serve gradient steps, also across layout switches;
* a gradient layout is checked once, not every step;
* ranks outside a process set step on their own gradients;
* after a failure on one rank only, ranks are in step again.
"""

from __future__ import annotations

import pytest
from _launch_util import launch_ranks
import torch

import _hvd_semantics_jobs as jobs

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def named():

    return launch_ranks(jobs.named_and_errors, 2, timeout=170)


@pytest.fixture(scope="module")
def joins():

    return launch_ranks(jobs.join_and_optimizers, 2, timeout=170)


def grads(factory, params, loss, rank, step):
    """The gradient of one rank's loss at ``params`` (a fresh module, plain autograd)."""
    model = factory()
    with torch.no_grad():
        for p, v in zip(model.parameters(), params):
            p.copy_(v)
    loss(model, rank, step).backward()
    return [p.grad for p in model.parameters()]


def sgd(params, gradients):
    return [p - jobs.LR * g for p, g in zip(params, gradients)]


def initial(factory):
    return [p.detach().clone() for p in factory().parameters()]


def test_async_ops_pair_by_name_not_by_order(named):
    a = [torch.full((3,), 1.0), torch.full((3,), 2.0)]
    b = [torch.arange(4.0), torch.arange(4.0) * 2]
    for res in named:
        got_a, got_b = res["by_name"]
        assert torch.equal(got_a, a[0] + a[1]) and torch.equal(got_b, b[0] + b[1])
        assert res["polled_before"] is False  # held until paired: not done yet


def test_duplicate_name_in_flight_is_a_value_error(named):
    x = [torch.full((2,), 1.0), torch.full((2,), 2.0)]
    for res in named:
        kind, is_value_error, message = res["dup"]["second"].split("|", 2)
        assert kind == "DuplicateName" and is_value_error == "True"
        assert "'dup'" in message and "HINT:" in message
        # the held op, submitted on both sides of a barrier, paired up; the name is free afterwards
        assert torch.equal(res["dup"]["result"], torch.cat(x))
        assert torch.equal(res["dup"]["reuse"], torch.cat(x))


def test_finished_names_are_forgotten(named):
    for res in named:
        assert res["names_recorded"] < 300


def test_waits_nobody_can_satisfy_raise_everywhere_then_late_submissions_pair(named):
    x = [torch.full((2,), 1.0), torch.full((2,), 2.0)]
    for rank, res in enumerate(named):
        assert res["deadlock"].startswith("RingtrainError") and "every rank waits" in res["deadlock"]
        mine, other = res["late_pair"]
        # rank 0 submitted p with x and q with 10x; rank 1 the other way round
        p = x[0] + 10 * x[1]
        q = 10 * x[0] + x[1]
        assert torch.equal(mine, p if rank == 0 else q) and torch.equal(other, q if rank == 0 else p)


def test_sparse_allreduce_async_is_callable_and_averages(named):
    want = torch.zeros(5, 3)
    for r in range(2):
        want[r] += (r + 1.0) / 2
        want[4] += 2.0 * (r + 1) / 2
    for res in named:
        assert res["sparse_callable"]
        is_sparse, dense = res["sparse"]
        assert is_sparse and torch.equal(dense, want)


def test_alltoall_follows_horovods_rules(named):
    for rank, res in enumerate(named):
        errors = res["a2a_errors"]
        for case in ("float_splits", "int64_splits", "too_many_rows", "uneven_no_splits", "count"):
            kind, is_value_error, _ = errors[case].split("|", 2)
            assert kind == "InvalidArgument" and is_value_error == "True", (case, errors[case])
        assert "32-bit" in errors["float_splits"] and "more rows" in errors["too_many_rows"]
        # splits adding up to fewer rows than there are: the rows past the sum are not sent
        t = [torch.arange(10.0).reshape(5, 2) + 100 * r for r in range(2)]
        want = torch.cat([t[0][0:1], t[1][0:1]]) if rank == 0 else torch.cat([t[0][1:3], t[1][1:3]])
        got, received = res["a2a_fewer_rows"]
        assert torch.equal(got, want) and received.tolist() == ([1, 1] if rank == 0 else [2, 2])


def test_ranks_are_in_step_after_a_failure_on_one_rank(named):
    assert "mismatched collectives" in named[1]["asymmetric"] and "barrier()" in named[1]["asymmetric"]
    assert "asymmetric" not in named[0]
    for res in named:
        assert res["after_asymmetric"].item() == 3.0


def test_default_names_are_unique_across_param_groups(named):
    want = sorted(f"allreduce.noname.{i}.{j}" for i in range(2) for j in range(2))
    for res in named:
        assert res["noname"] == want


def test_join_fails_only_the_ops_of_ranks_that_have_not_joined(joins):
    active = joins[1]
    for key in ("allgather_while_joined", "broadcast_while_joined"):
        kind, _, message = active[key].split("|", 2)
        assert kind == "RingtrainError" and "had already called join()" in message
    assert active["allreduce_while_joined"].tolist() == [2.0, 3.0]  # averaged with rank 0's zeros
    assert active["named_while_joined"].tolist() == [8.0]
    assert joins[0]["join"] == joins[1]["join"] == 1  # rank 1 joined last


def test_sparse_gradients_stay_sparse_and_are_averaged(joins):
    counts = torch.zeros(6)
    for idx in (torch.tensor([[0, 1, 1], [3, 5, 0]]), torch.tensor([[2, 1], [5, 5]])):
        counts += torch.bincount(idx.reshape(-1), minlength=6).float()
    want = (counts / 2).unsqueeze(1).expand(6, 2)
    for res in joins:
        for sparse_as_dense in (False, True):
            is_sparse, grad = res[f"sparse_grad_{sparse_as_dense}"]
            assert is_sparse and torch.equal(grad, want)


def test_a_gradient_layout_is_checked_once_not_every_step(joins):
    for res in joins:
        assert res["rounds_per_step"] == [1, 0, 0]


def test_joined_rank_serves_steps_across_layout_switches(joins):
    a, b = initial(jobs.model_a), initial(jobs.model_b)
    mean = lambda gs: [(x + y) / 2 for x, y in zip(*gs)]  # noqa: E731
    a = sgd(a, mean([grads(jobs.model_a, a, jobs.loss_a, r, 0) for r in range(2)]))
    b = sgd(b, mean([grads(jobs.model_b, b, jobs.loss_b, r, 0) for r in range(2)]))
    a1, b1 = list(a), list(b)  # rank 1 stops here and joins
    for which, step in [("a", 1), ("a", 2), ("b", 1), ("a", 3)]:  # rank 0 alone, averaged with zeros
        if which == "a":
            a = sgd(a, [g / 2 for g in grads(jobs.model_a, a, jobs.loss_a, 0, step)])
        else:
            b = sgd(b, [g / 2 for g in grads(jobs.model_b, b, jobs.loss_b, 0, step)])
    for rank, (want_a, want_b) in enumerate([(a, b), (a1, b1)]):
        got_a, got_b = joins[rank]["switch_params"]
        for got, want in zip(got_a + got_b, want_a + want_b):
            assert torch.allclose(got, want, atol=1e-6, rtol=0)
        assert joins[rank]["switch_join"] == 0  # rank 0 joined last
        assert joins[rank]["after_join"].item() == 3.0


def test_three_ranks_process_set_optimizer_and_join_order():

    results = launch_ranks(jobs.three_ranks, 3, timeout=170)
    a = initial(jobs.model_a)
    g = [grads(jobs.model_a, a, jobs.loss_a, r, 0) for r in range(3)]
    members = sgd(a, [(x + y) / 2 for x, y in zip(g[0], g[1])])
    outsider = sgd(a, g[2])  # rank 2 is not in the set: its own gradient, no hooks
    for rank, want in enumerate([members, members, outsider]):
        for got, w in zip(results[rank]["set_params"], want):
            assert torch.allclose(got, w, atol=1e-6, rtol=0), rank
    assert results[1]["sum_while_0_joined"].item() == results[2]["sum_while_0_joined"].item() == 5.0
    assert results[1]["sum_while_0_2_joined"].item() == 2.0
    assert [res["join"] for res in results] == [1, 1, 1]
