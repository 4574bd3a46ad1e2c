"""metrics.csv's file (tracking/table.py): appended row by row, rewound after a restart, cut-off lines dropped."""

from __future__ import annotations

import csv

import pytest

from ringtrain.errors import RingtrainError
from ringtrain.tracking.table import Table


def rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_rows_are_on_disk_after_each_append_and_new_columns_keep_old_rows(tmp_path):
    path = tmp_path / "m.csv"
    table = Table(str(path), ("step", "time"))
    assert table.open(None) == 0
    table.append({"step": 1, "time": 5.0, "loss": 0.5})
    assert rows(path) == [{"step": "1", "time": "5.0", "loss": "0.5"}]  # readable before close: flushed
    table.append({"step": 2, "time": 6.0, "acc": 1 / 3})
    assert rows(path) == [{"step": "1", "time": "5.0", "loss": "0.5", "acc": ""},
                          {"step": "2", "time": "6.0", "loss": "", "acc": repr(1 / 3)}]
    table.close()
    assert float(rows(path)[1]["acc"]) == 1 / 3  # every digit


def test_reopening_drops_rows_past_the_resumed_step_and_a_cut_off_line(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("step,loss\n1,0.9\n2,0.8\n3,0.7\n4,0.6\n5,0.")  # a kill cut the last line
    table = Table(str(path))
    assert table.open(keep_through=2) == 2
    table.append({"step": 3, "loss": 0.65})
    table.close()
    assert [(r["step"], r["loss"]) for r in rows(path)] == [("1", "0.9"), ("2", "0.8"), ("3", "0.65")]
    path.write_text("step,loss\n1,0.9\n2,0.")
    table = Table(str(path))
    assert table.open(keep_through=None) == 0
    table.close()
    assert path.read_text() == "step,loss\n1,0.9\n"


def test_a_file_that_is_not_a_log_is_named_and_left_alone(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("name,value\na,1\n")
    with pytest.raises(RingtrainError, match="not a ringtrain log") as e:
        Table(str(path)).open(None)
    assert "HINT:" in str(e.value)
    assert path.read_text() == "name,value\na,1\n"
    path.write_text("step,loss\none,1\n")
    with pytest.raises(RingtrainError, match="without a numeric step"):
        Table(str(path)).open(3)
    assert path.read_text() == "step,loss\none,1\n"
