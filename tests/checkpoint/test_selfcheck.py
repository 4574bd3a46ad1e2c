"""The resumed run's self-check (checkpoint/selfcheck.py), in one process: what is recorded, what is compared."""

from __future__ import annotations

import pytest
import torch

from ringtrain.checkpoint import selfcheck
from ringtrain.errors import RingtrainError


def _first_run(folder, values):
    record = selfcheck.LossRecord(str(folder), 0, 0.0)
    record.start(None, comparable=False)
    for (step, micro), value in values.items():
        record.saw(step, micro, torch.tensor(value))
    record.close()


def test_equal_losses_after_a_resume_are_checked_and_a_different_one_is_named(tmp_path, capsys):
    _first_run(tmp_path, {(0, 0): 1.0, (1, 0): 0.5, (2, 0): 0.25})
    record = selfcheck.LossRecord(str(tmp_path), 0, 0.0)
    record.start(1, comparable=True)
    record.saw(1, 0, torch.tensor(0.5))
    record.saw(2, 0, torch.tensor(0.25))
    assert "resume checked" in capsys.readouterr().out
    record.close()
    # A later resume from step 1 again, whose step 1 differs: named, with both values and the fixes.
    record = selfcheck.LossRecord(str(tmp_path), 0, 0.0)
    record.start(1, comparable=True)
    record.saw(1, 0, torch.tensor(0.75))
    err = capsys.readouterr().err
    assert "at step 1 its loss is 0.75, where the run before the restart had 0.5" in err
    assert "ring.batches(get_batch)" in err and "ring.keep(loader)" in err
    record.close()
    assert selfcheck.read_record(record.path) == {(0, 0): 1.0, (1, 0): 0.75}  # the record goes on from the resume


def test_the_first_step_is_exact_and_later_ones_loose_and_nothing_is_said_when_not_comparable(tmp_path, capsys):
    _first_run(tmp_path, {(0, 0): 1.0, (1, 0): 0.5})
    record = selfcheck.LossRecord(str(tmp_path), 0, 0.0)
    record.start(0, comparable=True)
    record.saw(0, 0, torch.tensor(1.0))
    record.saw(1, 0, torch.tensor(0.5000001))  # the last bits of a 3-rank sum: no false alarm
    assert "not the run it continues" not in capsys.readouterr().err
    record.close()
    record = selfcheck.LossRecord(str(tmp_path), 0, 0.0)
    record.start(0, comparable=False)  # another world size or configuration: nothing is due
    record.saw(0, 0, torch.tensor(3.0))
    assert capsys.readouterr().err == ""
    record.close()


def test_a_line_cut_short_is_skipped(tmp_path):
    _first_run(tmp_path, {(0, 0): 1.0})
    path = tmp_path / "losses" / "rank-00000.txt"
    path.write_text(path.read_text() + "1 0 0x1.00")
    assert selfcheck.read_record(str(path)) == {(0, 0): 1.0}
    with open(path, "a") as f:
        f.write("garbage\n")
    assert selfcheck.read_record(str(path))[(0, 0)] == 1.0


@pytest.mark.parametrize("value", [-1, float("nan"), "exact", True])
def test_bad_tolerances_are_refused(value):
    with pytest.raises(RingtrainError, match="resume_tolerance"):
        selfcheck.tolerance_of(value, torch.device("cpu"), False)


def test_auto_tolerance_is_exact_on_the_cpu():
    assert selfcheck.tolerance_of("auto", torch.device("cpu"), False) == 0.0
    assert selfcheck.tolerance_of("auto", torch.device("meta"), False) == 1e-4
    assert selfcheck.tolerance_of("auto", torch.device("meta"), True) == 0.0
    assert selfcheck.tolerance_of(None, torch.device("cpu"), False) is None
