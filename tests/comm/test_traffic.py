"""comm/traffic.py: the bytes a DDP comm hook all-reduced, per step under way, last step and in all."""

from __future__ import annotations

from ringtrain.comm.traffic import Traffic


def test_counts_per_step_and_in_all():
    t = Traffic()
    assert (t.sent, t.sent_last_step, t.total, t.calls) == (0, 0, 0, 0)
    t.count(100)
    t.count(28)
    assert (t.sent, t.sent_last_step, t.total, t.calls) == (128, 0, 128, 2)
    t.step_done()
    assert (t.sent, t.sent_last_step, t.total, t.calls) == (0, 128, 128, 2)
    t.count(8)
    t.step_done()
    assert (t.sent, t.sent_last_step, t.total, t.calls) == (0, 8, 136, 3)
    t.step_done()  # a step that sent nothing
    assert t.sent_last_step == 0 and t.total == 136
