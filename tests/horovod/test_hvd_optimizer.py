"""DistributedOptimizer reaches the parameters of one process training on the combined batch."""

from __future__ import annotations

import pytest
from _launch_util import launch_ranks
import torch

import _hvd_expected as ex
import _hvd_jobs as jobs

pytestmark = pytest.mark.timeout(180)

N = 2


@pytest.fixture(scope="module")
def results():

    return launch_ranks(jobs.training, N, timeout=170)


def assert_close(got, want, tol=1e-5):
    assert torch.allclose(got, want, atol=tol, rtol=0), (got - want).abs().max()


@pytest.mark.parametrize("name", ["sgd", "clip", "groups", "fusion_off", "adam_predivide"])
def test_equals_single_process_on_the_combined_batch(results, name):
    factory, _, k, clip = jobs.CONFIGS.get(name, jobs.CONFIGS["sgd"])
    want = ex.reference(factory, N, jobs.STEPS, k, clip=clip)
    for res in results:
        assert_close(res[name], want)


def test_backward_passes_per_step_accumulates(results):
    want = ex.reference(jobs.SGD, N, jobs.STEPS, k=2)
    for res in results:
        assert_close(res["bpps2"], want)
        assert_close(res["strategy"], want)  # strategy="hvd" with accumulate=2 runs the same machinery


def test_fp16_compression_within_fp16_tolerance(results):
    want = ex.reference(jobs.SGD, N, jobs.STEPS)
    for res in results:
        assert_close(res["fp16"], want, tol=2e-3)
        assert not torch.equal(res["fp16"], res["sgd"])  # it did travel as fp16


def test_sum_op_is_the_summed_gradient(results):
    want = ex.reference(jobs.SGD, N, jobs.STEPS, loss_scale=N)
    for res in results:
        assert_close(res["sum"], want)


def test_fusion_on_and_off_agree(results):
    for res in results:
        assert_close(res["fusion_off"], res["sgd"], tol=1e-6)
        assert res["fusion_on_buckets"] == 1 and res["fusion_off_buckets"] == 6


def test_adasum_optimizer_is_the_delta_rule_by_hand(results):
    want = ex.adasum_reference(N, jobs.STEPS, lr=0.1)
    for res in results:
        assert_close(res["adasum"], want)
    assert torch.equal(results[0]["adasum"], results[1]["adasum"])


def test_join_lets_a_rank_finish_early(results):
    # rank 1 joined after 3 steps; rank 0's 4th step averaged its gradient with rank 1's zeros
    assert_close(results[0]["join"][0], ex.reference(jobs.SGD, N, jobs.STEPS, extra_rank0_steps=1))
    assert_close(results[1]["join"][0], ex.reference(jobs.SGD, N, jobs.STEPS))
    assert results[0]["join"][1] == results[1]["join"][1] == 0  # rank 0 joined last


def test_broadcast_optimizer_state_makes_states_identical(results):
    states = [res["states"] for res in results]
    for key in ("trained", "fresh"):
        a, b = states[0][key], states[1][key]
        assert a["param_groups"] == b["param_groups"], key
        assert a["state"].keys() == b["state"].keys(), key
        for pid in a["state"]:
            for name, value in a["state"][pid].items():
                other = b["state"][pid][name]
                assert torch.equal(value, other) if torch.is_tensor(value) else value == other
    assert len(states[0]["trained"]["state"]) == 4 and states[1]["trained"]["param_groups"][0]["lr"] == 0.01
    assert states[1]["trained"]["param_groups"][0]["betas"] == (0.8, 0.9)
    # fresh everywhere: Horovod first steps once on zero gradients, so the state exists (zero momentum
    # for all 6 parameters), zero gradients are left behind, and without weight decay nothing moves
    fresh = states[0]["fresh"]["state"]
    assert len(fresh) == 6 and all(torch.count_nonzero(s["momentum_buffer"]) == 0 for s in fresh.values())
    assert states[1]["fresh"]["param_groups"][0]["lr"] == 0.3
    for res in results:
        assert res["states"]["fresh_params_unchanged"]
        assert res["states"]["fresh_grads"] == [0.0] * 6
        assert res["states"]["sparse_init_grad_is_sparse"]  # model given positionally: Embedding(sparse=True)


def test_misuse_is_reported(results):
    for res in results:
        errors = res["errors"]
        assert "zero_grad() was called after loss.backward()" in errors["zero_grad"]
        assert "more than backward_passes_per_step=1" in errors["passes"]
        assert errors["passes_now"] == 3 and errors["isinstance"]
        assert "must be unique" in errors["dup_names"]
        assert "wrapped again by a newer DistributedOptimizer" in errors["retired"]


def test_elastic_run_restores_the_last_commit_and_resumes(results):
    want = ex.reference(jobs.SGD, N, jobs.STEPS)
    for res in results:
        params, attempts, result, sampler = res["elastic"]
        assert_close(params, want)  # the step taken before the failure was rolled back, then redone once
        assert attempts == [0, 1] and result == "finished"
        assert sampler == {"epoch": 0, "processed_num": jobs.STEPS * 4 * N}
