"""DDP gradient compression (comm/ddp_hooks.py, comm/powersgd.py) in real 2-rank Gloo jobs: equal to
uncompressed DDP where it must be, within a point of its accuracy on the real digits, several
buckets on Gloo (where torch's own PowerSGD hook aborts), exact resume after kill -9, ``"auto"``'s
rule, and the refusals. In one process (a one-rank Gloo group): the names ``check`` keeps, the hook
each choice makes, the cast hook's rounding and byte counts, and the rule's boundaries (issue 38;
PowerSGD's own state and arithmetic: test_powersgd.py)."""

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


# --- in one process (issue 38): the names, the hooks made, the cast hook's arithmetic, "auto"'s rule -----------
@pytest.mark.parametrize("name", ["none", "fp16", "bf16", "auto"])
def test_check_keeps_a_name_and_makes_powersgd_an_options_object(name):
    assert ddp_hooks.check(name) == name
    made = ddp_hooks.check("powersgd")
    assert isinstance(made, rt.strategies.PowerSGD) and (made.rank, made.start_step) == (8, 0)
    mine = rt.strategies.PowerSGD(rank=2)
    assert ddp_hooks.check(mine) is mine


@pytest.mark.parametrize("bad", [None, "FP16", 16])
def test_check_refuses_anything_else_naming_the_choices(bad):
    with pytest.raises(rt.RingtrainError) as error:
        ddp_hooks.check(bad)
    assert error.value.message == f"DDP got compression={bad!r}"
    assert error.value.hint == ("use one of 'none', 'fp16', 'bf16', 'powersgd', 'auto', or "
                                "rt.strategies.PowerSGD(rank=...).")


def test_make_hook_picks_the_hook_of_each_choice(engine):
    model = torch.nn.Linear(2, 1)
    assert ddp_hooks.make_hook("none", model, None) is None
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        state, fn = ddp_hooks.make_hook(name, model, None)
        assert isinstance(state, ddp_hooks.CastHook) and state.dtype == dtype and fn is ddp_hooks.CastHook.hook
        assert state.hook_name == f"{name}_hook" and state.world_size == 1 and state.state_dict() == {}
    state, fn = ddp_hooks.make_hook(rt.strategies.PowerSGD(rank=1), model, None)
    assert fn is ddp_hooks.PowerSGDHook.hook and sorted(state.names.values()) == ["bias", "weight"]
    assert state.names[model.weight] == "weight"
    with pytest.raises(AssertionError, match="unresolved compression 'auto'"):
        ddp_hooks.make_hook("auto", model, None)


class _Bucket:
    def __init__(self, values, last):
        self._buffer, self._last = torch.tensor(values), last

    def buffer(self):
        return self._buffer

    def is_last(self):
        return self._last


@pytest.mark.parametrize("name, wire", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_the_cast_hook_sends_half_the_bytes_and_writes_back_the_rounded_mean(engine, name, wire):
    state, fn = ddp_hooks.make_hook(name, torch.nn.Linear(1, 1), None)
    bucket = _Bucket([1 / 3, 2.0, -0.1], last=False)
    out = fn(state, bucket).wait()
    assert out is bucket.buffer() and out.dtype == torch.float32
    assert out.tolist() == torch.tensor([1 / 3, 2.0, -0.1]).to(wire).float().tolist()  # divided by 1 rank
    assert (state.sent, state.sent_last_step, state.calls) == (6, 0, 1)
    fn(state, _Bucket([1.0], last=True)).wait()
    assert (state.sent, state.sent_last_step, state.total) == (0, 8, 8)


def test_bf16_keeps_a_large_gradient_that_fp16_turns_into_inf(engine):
    for name, finite in (("fp16", False), ("bf16", True)):
        state, fn = ddp_hooks.make_hook(name, torch.nn.Linear(1, 1), None)
        assert bool(torch.isfinite(fn(state, _Bucket([1e6], last=True)).wait()).all()) is finite


def test_gradient_bytes_count_trainable_parameters_only():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2).half())
    assert ddp_hooks.gradient_bytes(model) == 8 * 4 + 6 * 2
    model[0].weight.requires_grad_(False)
    assert ddp_hooks.gradient_bytes(model) == 2 * 4 + 6 * 2


@pytest.mark.parametrize("grad_mb, choice", [(24, "none"), (26, "bf16"), (49, "bf16"), (51, "powersgd")])
def test_the_rule_at_its_boundaries(grad_mb, choice):
    # 2 ranks at 1 GB/s of bus bandwidth: the ring moves grad x 2(n-1)/n = grad bytes, 1 ms per MB
    picked = ddp_hooks.rule(1e9, int(grad_mb * 1e6), 2)
    assert picked.full_ms == pytest.approx(grad_mb) and picked.bus_gbit == 8.0
    assert (picked.compression if isinstance(picked.compression, str) else "powersgd") == choice


def test_one_rank_moves_nothing_and_measures_no_bandwidth(engine):
    assert ddp_hooks.rule(1.0, 10 ** 9, 1).compression == "none" and ddp_hooks.rule(1.0, 10 ** 9, 1).full_ms == 0.0
    assert ddp_hooks.measure_bus_bandwidth(None, torch.device("cpu"), nbytes=4096, repeats=1) == 0.0  # x 2(n-1)/n
    assert ddp_hooks.rule(0.0, 10, 2).full_ms == pytest.approx(10 / 1.0 * 1e3)  # a zero measurement, no division by 0


def test_the_choice_is_described_with_the_measurement():
    text = ddp_hooks.LinkChoice(8.0, 2.4, "none").describe(2.0)
    assert text == ("compression='auto': the link all-reduces at 8.00 Gbit/s (bus bandwidth, 3 x 4 MiB); 2.0 MB of "
                    "gradients would take 2 ms a step -> 'none'")
