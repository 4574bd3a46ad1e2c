"""Issue 36, items 5, 6 and 8: the Ring's own traps are loud at the first step where they can be seen."""

from __future__ import annotations

import pytest

import _own_state_jobs as jobs


def test_loss_backward_under_accumulate_raises_at_the_first_step():
    said = jobs.loss_backward_under_accumulate()
    assert "no ring.backward(loss) since this optimizer's last step" in said, said
    assert "Ring(accumulate=4)" in said and "HINT: replace loss.backward() with ring.backward(loss)" in said


@pytest.mark.timeout(180)
def test_an_optimizer_not_given_to_setup_under_fsdp_raises_at_its_first_step(run_ranks):
    for said in run_ranks(jobs.optimizer_not_given_under_fsdp):
        assert "steps 4 parameter(s) that ring.setup replaced" in said, said
        assert "model, optimizer = ring.setup(model, optimizer)" in said


@pytest.mark.timeout(180)
def test_a_plain_dataloader_under_ddp_is_named_once(run_ranks, capfd):
    steps = run_ranks(jobs.plain_loader_under_ddp)
    out = capfd.readouterr()
    text = out.out + out.err
    assert steps == [12, 12]  # every rank read all 96 samples: what the warning says
    assert text.count("is not sharded") == 1, text
    assert "`train_loader`" in text and "12 steps per epoch on each rank, instead of 6" in text
    assert "train_loader = ring.loader(dataset, batch_size=8, shuffle=True)" in text


@pytest.mark.timeout(180)
def test_a_ring_loader_under_ddp_gets_no_warning(run_ranks, capfd):
    assert run_ranks(jobs.plain_loader_under_ddp, use_ring_loader=True) == [6, 6]
    out = capfd.readouterr()
    assert "is not sharded" not in out.out + out.err
