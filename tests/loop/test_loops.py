"""The loops people already have (issue 30): ``ring.steps``, saves that follow optimizer steps wherever the
batches come from, exact resumes whatever the loop does between steps, and a script's own accumulation."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ringtrain as rt


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(0.2), nn.Linear(8, 2))


def _batch(step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + micro)
    return torch.randn(6, 4, generator=g), torch.randint(0, 2, (6,), generator=g)


def _steps_loop(folder, steps: int, stop_after: int | None = None, k: int = 1) -> tuple[dict, list]:
    """A step loop with its own batches: an evaluation (random numbers) before the first batch of every step,
    and random draws right after the step — what a resumed run must repeat exactly."""
    ring = rt.Ring(seed=0, checkpoint_dir=str(folder), save_every=3, accumulate=k)
    model = _model()
    model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    seen = []
    for step in ring.steps(steps):
        seen.append(("eval", step, torch.randn(()).item()))  # evaluation on random batches
        for micro in range(k):
            x, y = _batch(step, micro)
            ring.backward(F.cross_entropy(model(x), y))
        opt.step()
        opt.zero_grad()
        seen.append(("after", step, torch.rand(()).item()))  # drawn right after the step
        if stop_after is not None and step == stop_after:
            break  # the "kill": this Ring is dropped here, as a killed process would drop it
    params = {k: v.clone() for k, v in model.state_dict().items()}
    return params, seen


def test_steps_yields_optimizer_steps_and_saves_every_n_with_the_scripts_own_batches(tmp_path):
    """Issue 30, silent failure 1: save_every with batches that are not a ring loader's never saved."""
    params, seen = _steps_loop(tmp_path / "ck", 7)
    assert [s for kind, s, _ in seen if kind == "eval"] == list(range(7))
    assert sorted(n for n in os.listdir(tmp_path / "ck") if n.startswith("step-")) == [
        "step-000000003.pt", "step-000000006.pt"]


@pytest.mark.parametrize("k", [1, 2])
def test_a_resumed_steps_loop_repeats_exactly_what_came_after_its_checkpoint(tmp_path, k):
    """Issue 30, silent failure 3: random draws between optimizer.step() and the next batch (an evaluation before
    the first batch, a draw right after the step) come out the same after a resume."""
    whole, seen_whole = _steps_loop(tmp_path / "whole", 8, k=k)
    _steps_loop(tmp_path / "cut", 8, stop_after=4, k=k)  # checkpoint of step 3 written; steps 4 and 5 lost
    resumed, seen_resumed = _steps_loop(tmp_path / "cut", 8, k=k)
    assert all(torch.equal(resumed[name], whole[name]) for name in whole)
    assert seen_resumed == seen_whole[-len(seen_resumed):] and seen_resumed[0][:2] == ("eval", 3)


def test_a_resumed_epochs_loop_repeats_random_draws_right_after_the_step(tmp_path):
    data = torch.utils.data.TensorDataset(torch.randn(40, 4), torch.randint(0, 2, (40,)))

    def run(folder, stop_at_step=None):
        ring = rt.Ring(seed=0, checkpoint_dir=str(folder), save_every=3)
        model = _model()
        model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        loader = ring.loader(data, batch_size=4, shuffle=True)
        seen = []
        for _ in ring.epochs(2):
            for x, y in loader:
                ring.backward(F.cross_entropy(model(x), y))
                opt.step()
                opt.zero_grad()
                seen.append(torch.rand(()).item())
                if ring.optimizer_steps == stop_at_step:
                    return None, None
        return {k: v.clone() for k, v in model.state_dict().items()}, seen

    whole, seen_whole = run(tmp_path / "whole")
    run(tmp_path / "cut", stop_at_step=14)
    resumed, seen_resumed = run(tmp_path / "cut")
    assert all(torch.equal(resumed[name], whole[name]) for name in whole)
    assert seen_resumed == seen_whole[-len(seen_resumed):] and len(seen_resumed) == 20 - 12


def _break_after_six(ring: rt.Ring) -> None:
    model = _model()
    model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for step in ring.steps(10):
        ring.backward(F.cross_entropy(model(_batch(step)[0]), _batch(step)[1]))
        opt.step()
        opt.zero_grad()
        if ring.optimizer_steps == 6:
            break  # right after a due step (save_every=3): the safe point at the next top never comes


def test_a_loop_that_breaks_right_after_a_due_step_still_saves_it(tmp_path):
    ring = rt.Ring(checkpoint_dir=str(tmp_path / "closed"), save_every=3)
    _break_after_six(ring)
    ring.close()
    assert "step-000000006.pt" in os.listdir(tmp_path / "closed")
    with rt.Ring(checkpoint_dir=str(tmp_path / "with"), save_every=3) as ring:
        _break_after_six(ring)
    assert "step-000000006.pt" in os.listdir(tmp_path / "with")


def test_an_epochs_loop_with_its_own_batches_saves_at_the_next_backward_and_says_so(tmp_path, capsys):
    ring = rt.Ring(checkpoint_dir=str(tmp_path / "ck"), save_every=2)
    model = _model()
    model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in ring.epochs(1):
        for step in range(5):
            ring.backward(F.cross_entropy(model(_batch(step)[0]), _batch(step)[1]))
            opt.step()
            opt.zero_grad()
    out = capsys.readouterr().out
    assert "step-000000002.pt" in os.listdir(tmp_path / "ck") and "step-000000004.pt" in os.listdir(tmp_path / "ck")
    assert out.count("is written at the next ring.backward") == 1 and "HINT: loop with `for step in ring.steps" in out


# --- the script's accumulation and the ring's ---------------------------------------------------

def test_a_loop_of_k_backward_calls_then_one_step_is_right_at_every_epoch_end():
    """Issue 30, silent failure 2: 5 batches per epoch, k = 2, the loop takes 2 batches per iteration from a ring
    loader through ring.epochs: every iteration is one optimizer step on exactly its 2 batches."""
    data = torch.utils.data.TensorDataset(torch.randn(5, 4), torch.randint(0, 2, (5,)))
    ring = rt.Ring(accumulate=2)
    model = _model().eval()  # no dropout: compared with a hand-made reference
    reference = _model().eval()
    model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)

    def batches():
        for _ in ring.epochs(4):
            yield from ring.loader(data, batch_size=1)

    stream, moved = batches(), []
    for _ in range(8):
        before = [p.detach().clone() for p in model.parameters()]
        pair = [next(stream) for _ in range(2)]
        for x, y in pair:
            ring.backward(F.cross_entropy(model(x), y))
        opt.step()
        opt.zero_grad()
        moved.append(max((p - b).abs().max().item() for p, b in zip(model.parameters(), before)))
        (sum(F.cross_entropy(reference(x), y) for x, y in pair) / 2).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    assert all(m > 0 for m in moved), moved
    assert ring.optimizer_steps == 8
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))


def test_a_step_the_window_does_not_end_raises_naming_both_counts():
    ring = rt.Ring(accumulate=2)
    model = _model()
    model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for micro in range(2):
        ring.backward(F.cross_entropy(model(_batch(0, micro)[0]), _batch(0, micro)[1]))
    opt.step()  # the loop accumulates itself: 2 backward calls per step
    ring.backward(F.cross_entropy(model(_batch(1)[0]), _batch(1)[1]))  # then only 1
    with pytest.raises(rt.RingtrainError, match=r"(?s)after 1 ring.backward call.*accumulate=2.*HINT"):
        opt.step()


def test_a_boundary_no_step_followed_raises():
    ring = rt.Ring(accumulate=2)
    model = _model()
    model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for micro in range(2):
        ring.backward(F.cross_entropy(model(_batch(0, micro)[0]), _batch(0, micro)[1]))
    with pytest.raises(rt.RingtrainError, match=r"(?s)no optimizer.step\(\) followed.*HINT"):
        ring.backward(F.cross_entropy(model(_batch(1)[0]), _batch(1)[1]))


def test_a_steps_loop_whose_optimizer_the_ring_does_not_know_is_refused_not_run_for_ever():
    """ring.steps counts optimizer steps: an optimizer made after ring.setup(model), never given to it, ended no
    step and the loop yielded step 0 for ever (found trying a script as a user writes it)."""
    ring = rt.Ring()
    model = ring.setup(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(rt.RingtrainError, match=r"(?s)ring.setup was given no optimizer.*repeat for ever.*HINT.*"
                                                r"ring.setup\(model, optimizer\)"):
        for step in ring.steps(5):
            assert step == 0
            ring.backward(F.cross_entropy(model(_batch(step)[0]), _batch(step)[1]))
            opt.step()
            opt.zero_grad()


def test_periodic_saves_with_an_optimizer_the_ring_does_not_know_are_refused(tmp_path):
    """save_every counts optimizer steps: with no optimizer given to ring.setup no checkpoint was ever written."""
    ring = rt.Ring(checkpoint_dir=str(tmp_path / "ck"), save_every=2)
    model = ring.setup(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = ring.loader(torch.utils.data.TensorDataset(torch.randn(24, 4), torch.randint(0, 2, (24,))),
                         batch_size=4)
    with pytest.raises(rt.RingtrainError, match=r"(?s)save_every=2.*no optimizer.*ran 1 time.*HINT"):
        for _ in ring.epochs(1):
            for x, y in loader:
                ring.backward(F.cross_entropy(model(x), y))
                opt.step()
                opt.zero_grad()
    assert not [n for n in os.listdir(tmp_path / "ck") if n.startswith("step-")]


def test_accumulate_is_set_from_the_world_size_before_training_and_not_after():
    ring = rt.Ring()
    model = _model()
    model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ring.accumulate = 8 // ring.world_size
    assert ring.accumulate == 8
    ring.backward(F.cross_entropy(model(_batch(0)[0]), _batch(0)[1]))
    with pytest.raises(rt.RingtrainError, match="after training began"):
        ring.accumulate = 2
    ring = rt.Ring(global_batch=24)
    ring.loader(torch.utils.data.TensorDataset(torch.randn(48, 4)), batch_size=6)
    assert ring.accumulate == 4 and ring.global_batch_size == 24
    with pytest.raises(rt.RingtrainError, match="not a whole number"):
        rt.Ring(global_batch=25).loader(torch.utils.data.TensorDataset(torch.randn(48, 4)), batch_size=6)
    with pytest.raises(rt.RingtrainError, match="both accumulate"):
        rt.Ring(global_batch=24, accumulate=2)


def test_a_resumed_run_sets_its_window_again(tmp_path):
    """A run resumed by ring.setup (steps restored) may still set ring.accumulate, or have Ring(global_batch=)
    set it at its first loader: its checkpoint was taken between windows (found by a requeued Slurm job,
    tests/cluster/test_slurm.py). Once this process has trained, a change is refused as before."""
    data = torch.utils.data.TensorDataset(torch.randn(48, 4), torch.randint(0, 2, (48,)))

    def run(folder, stop_at_step=None):
        ring = rt.Ring(seed=0, global_batch=8, checkpoint_dir=str(folder), save_every=2)
        model = _model()
        model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        loader = ring.loader(data, batch_size=4, shuffle=True)  # accumulate 2, set again when resumed
        for _ in ring.epochs(2):
            for x, y in loader:
                ring.backward(F.cross_entropy(model(x), y))
                opt.step()
                opt.zero_grad()
                if ring.optimizer_steps == stop_at_step:
                    return ring, None
        return ring, {k: v.clone() for k, v in model.state_dict().items()}

    _, whole = run(tmp_path / "whole")
    run(tmp_path / "cut", stop_at_step=5)  # the checkpoint of step 4 is what the next run resumes
    ring, resumed = run(tmp_path / "cut")
    assert ring.accumulate == 2 and ring.optimizer_steps == 12
    assert all(torch.equal(resumed[name], whole[name]) for name in whole)
    with pytest.raises(rt.RingtrainError, match="after training began"):
        ring.accumulate = 1


# --- what the script had, it keeps -------------------------------------------------------------

@pytest.mark.parametrize("given, canonical", [
    ("float16", "16-mixed"), ("bfloat16", "bf16-mixed"), ("float32", "32"), ("fp16", "16-mixed"), ("bf16", "bf16-mixed"),
    (torch.float16, "16-mixed"), (torch.bfloat16, "bf16-mixed"), (torch.float32, "32"), ("BF16", "bf16-mixed")])
def test_precision_takes_the_scripts_own_dtype(given, canonical):
    from ringtrain.loop.precision import canonical as name

    assert name(given) == canonical
    if canonical != "16-mixed":  # fp16 needs a GPU's autocast here
        assert rt.Ring(precision=given)._precision.name == canonical


def test_extras_ride_in_every_checkpoint_and_come_back(tmp_path):
    ring = rt.Ring(checkpoint_dir=str(tmp_path / "ck"), save_every=2)
    model = _model()
    model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ring.extras.update(model_args={"n_layer": 2}, best_val_loss=3.5)
    for step in ring.steps(2):
        ring.backward(F.cross_entropy(model(_batch(step)[0]), _batch(step)[1]))
        opt.step()
        opt.zero_grad()
    ring.save(str(tmp_path / "mine.pt"), model=model, iter_num=2)
    ring.close()
    assert rt.checkpoint_values(str(tmp_path / "mine.pt")) == {"model_args": {"n_layer": 2}, "best_val_loss": 3.5,
                                                               "iter_num": 2}
    ring = rt.Ring(checkpoint_dir=str(tmp_path / "ck"), save_every=2)
    model = _model()
    ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert ring.extras == {"model_args": {"n_layer": 2}, "best_val_loss": 3.5} and ring.optimizer_steps == 2
    assert ring.unwrap(model) is model
