"""DDP gradient compression (comm/ddp_hooks.py, comm/powersgd.py) in real 2-rank Gloo jobs: equal to
uncompressed DDP where it must be, within a point of its accuracy on the real digits, several
buckets on Gloo (where torch's own PowerSGD hook aborts), exact resume after kill -9, ``"auto"``'s
rule, and the refusals."""

from __future__ import annotations


import _compression_jobs as jobs
import pytest
from _launch_util import launch_ranks
import torch

import ringtrain as rt
from ringtrain.comm import ddp_hooks

import _fault_jobs  # noqa: E402
from _launch_util import outputs  # noqa: E402


@pytest.fixture(scope="module")
def plain(run_ranks_module):
    return run_ranks_module(jobs.train_wide, "none")


@pytest.fixture(scope="module")
def run_ranks_module():
    def run(fn, *args, nprocs: int = 2, timeout: float = 120):
        return launch_ranks(fn, nprocs, args=args, timeout=timeout)

    return run


@pytest.mark.timeout(120)
@pytest.mark.parametrize("compression, bound", [("fp16", 1e-4), ("bf16", 1e-3)])
def test_half_precision_gradients_stay_close_to_uncompressed(run_ranks_module, plain, compression, bound):
    out = run_ranks_module(jobs.train_wide, compression)
    assert torch.equal(out[0]["params"], out[1]["params"])
    assert (out[0]["params"] - plain[0]["params"]).abs().max().item() < bound
    assert out[0]["sent"][-1] * 2 == plain[0]["sent"][-1]  # half the bytes
    assert plain[0]["sent"][-1] == sum(p.numel() * 4 for p in jobs.wide_model().parameters())


@pytest.mark.timeout(120)
def test_full_rank_powersgd_equals_uncompressed_over_several_buckets(run_ranks_module, plain):
    # rank >= every matrix's smaller side and every matrix compressed: P spans M's columns, so P P^T M = M.
    # bucket_cap_mb=0.01 gives several buckets, each with two all-reduces: the same order on both ranks.
    out = run_ranks_module(jobs.train_wide, rt.strategies.PowerSGD(rank=64, min_compression_rate=0))
    assert (out[0]["params"] - plain[0]["params"]).abs().max().item() < 1e-5
    assert torch.equal(out[0]["params"], out[1]["params"])


@pytest.mark.timeout(120)
def test_low_rank_powersgd_sends_a_fraction_and_ranks_agree(run_ranks_module, plain):
    out = run_ranks_module(jobs.train_wide, rt.strategies.PowerSGD(rank=2))
    assert torch.equal(out[0]["params"], out[1]["params"])
    assert out[0]["sent"][-1] < plain[0]["sent"][-1] / 4
    assert (out[0]["params"] - plain[0]["params"]).abs().max().item() > 1e-4  # it did compress


@pytest.mark.timeout(120)
def test_powersgd_start_step_all_reduces_plainly_first(run_ranks_module, plain):
    out = run_ranks_module(jobs.train_wide, rt.strategies.PowerSGD(rank=1, start_step=3))
    assert out[0]["sent"][:2] == plain[0]["sent"][:2]
    assert out[0]["sent"][4] < plain[0]["sent"][4] / 4


@pytest.mark.stress  # 4 trainings of 6 epochs (about 2 min idle; over 8 under load): make test-stress
@pytest.mark.timeout(900)
def test_every_compression_keeps_digits_accuracy_within_a_point(run_ranks_module):
    accuracy = {c: run_ranks_module(jobs.digits_accuracy, c, timeout=200)[0] for c in ("none", "fp16", "bf16", "powersgd")}
    assert accuracy["none"] > 90, accuracy
    for compression, value in accuracy.items():
        assert value >= accuracy["none"] - 1.0, accuracy


@pytest.mark.timeout(240)
def test_powersgd_resumes_exactly_after_kill_9(tmp_path):
    # rank 1 SIGKILLs itself after step 8; the restart resumes from the step-6 checkpoint, whose meta holds
    # every rank's error feedback and the Q matrices: the final parameters equal the uninterrupted run's.
    clean, clean_paths = _fault_jobs.run_train(tmp_path / "clean", "--powersgd", "1")
    assert clean.returncode == 0, outputs(clean)
    crashed, paths = _fault_jobs.run_train(
        tmp_path / "crashed", "--powersgd", "1", RINGTRAIN_TEST_KILL_AT_STEP="8", RINGTRAIN_TEST_KILL_RANK="1",
        RINGTRAIN_TEST_KILL_MARKER=str(tmp_path / "killed"))
    assert crashed.returncode == 0, outputs(crashed)
    assert "ringtrain: resumed from" in crashed.stdout, outputs(crashed)
    diff = (torch.load(paths["out"]) - torch.load(clean_paths["out"])).abs().max().item()
    assert diff == 0.0, diff


def test_auto_rule_picks_by_the_measured_link():
    grad = 8_400_000  # the bench's mlp: 2.1M float32 gradients
    assert ddp_hooks.rule(11.8e9 / 8, grad, 2).compression == "none"  # loopback: 5.7 ms
    assert ddp_hooks.rule(2e9 / 8, grad, 2).compression == "bf16"  # 34 ms; 17 ms in bf16
    assert isinstance(ddp_hooks.rule(0.5e9 / 8, grad, 2).compression, rt.strategies.PowerSGD)  # 1 Gbit shaped
    choice = ddp_hooks.rule(0.5e9 / 8, grad, 2)
    assert "0.50 Gbit/s" in choice.describe(grad / 1e6) and "134 ms" in choice.describe(grad / 1e6)


@pytest.mark.timeout(120)
def test_auto_measures_once_and_says_what_it_chose(run_ranks_module, capfd):
    out = run_ranks_module(jobs.train_wide, "auto")
    assert out[0]["chosen"] == out[1]["chosen"] == "'none'"  # a tiny model on loopback
    assert "compression='auto': the link all-reduces at" in capfd.readouterr().out


@pytest.mark.parametrize("make, says", [
    (lambda: rt.strategies.DDP(compression="int8"), "compression='int8'"),
    (lambda: rt.strategies.PowerSGD(rank=0), "rank=0"),
    (lambda: rt.strategies.PowerSGD(start_step=-1), "start_step=-1"),
    (lambda: rt.strategies.PowerSGD(min_compression_rate="x"), "min_compression_rate"),
    (lambda: rt.strategies.PowerSGD(batched=True), "batched=True"),
])
def test_bad_compression_options_are_named(make, says):
    with pytest.raises(rt.RingtrainError, match="HINT") as error:
        make()
    assert says in str(error.value)
