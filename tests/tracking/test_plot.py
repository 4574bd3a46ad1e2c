"""ringtrain plot RUN_DIR: curves.png (one panel per metric) and ranks.png (per rank: data / compute / wait)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from _launch_util import child_env  # noqa: E402

from ringtrain.tracking import plot as plotting  # noqa: E402
from ringtrain.tracking.table import Table  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def write_run(folder, metrics: list[str], ranks: int) -> None:
    os.makedirs(folder, exist_ok=True)
    table = Table(os.path.join(folder, "metrics.csv"), ("step", "time"))
    table.open(None)
    for step in range(10, 110, 10):
        table.append({"step": step, "time": 1.0 * step, **{m: 1.0 / (step + i) for i, m in enumerate(metrics)}})
    table.close()
    if ranks:
        table = Table(os.path.join(folder, "ranks.csv"), ("step", "rank"))
        table.open(None)
        for step in range(10, 110, 10):
            for rank in range(ranks):
                data = 30.0 if rank == 1 else 1.0  # rank 1 starves its loader; the others wait for it
                wait = 0.0 if rank == 1 else 29.0
                table.append({"step": step, "rank": rank, "steps": 10, "ms_per_step": 40.0 + data + wait,
                              "data_ms": data, "compute_ms": 40.0, "wait_ms": wait})
        table.close()


def plot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtrain", "plot", *args], capture_output=True, text=True,
                          timeout=120, env=child_env())


def height(path) -> int:
    import matplotlib.image

    return matplotlib.image.imread(path).shape[0]


@pytest.mark.timeout(200)
def test_plot_writes_one_panel_per_metric_and_the_ranks_picture(tmp_path):
    pytest.importorskip("matplotlib")
    write_run(tmp_path / "two", ["loss", "acc"], ranks=3)
    done = plot(str(tmp_path / "two"))
    assert done.returncode == 0, done.stderr
    for name in ("curves.png", "ranks.png"):
        assert (tmp_path / "two" / name).read_bytes()[:8] == PNG
        assert f"wrote {tmp_path / 'two' / name}" in done.stdout
    write_run(tmp_path / "five", ["loss", "acc", "lr", "grad_norm", "val"], ranks=0)
    assert plotting.main([str(tmp_path / "five"), "--out", str(tmp_path / "pictures")]) == 0  # in-process: no new torch
    assert sorted(os.listdir(tmp_path / "pictures")) == ["curves.png"]  # no ranks.csv: no ranks.png
    assert height(tmp_path / "pictures" / "curves.png") > 1.5 * height(tmp_path / "two" / "curves.png")  # 2 rows of panels


def test_plot_names_a_folder_without_a_log(tmp_path, capsys):
    assert plotting.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "has no metrics.csv" in err and "HINT:" in err


def test_ranks_csv_adds_up_to_the_table_as_docs_observing_says():
    # docs/observing.md, "Adding up ranks.csv": the formula written there, computed by hand from the rows, is the
    # table's (per_rank_stats of run_totals); the intervals' own wait_ms summed is not (the trap it warns of).
    from ringtrain.liveness.stall import per_rank_stats
    from ringtrain.tracking.plot import run_totals

    rows = [  # rank 1 is the faster in the first interval, rank 0 over the run
        {"step": 10, "rank": 0, "steps": 10, "ms_per_step": 20.0, "data_ms": 2.0, "sync_ms": 9.0},
        {"step": 10, "rank": 1, "steps": 10, "ms_per_step": 19.0, "data_ms": 1.0, "sync_ms": 8.0},
        {"step": 20, "rank": 0, "steps": 10, "ms_per_step": 20.0, "data_ms": 2.0, "sync_ms": 9.0},
        {"step": 20, "rank": 1, "steps": 10, "ms_per_step": 25.0, "data_ms": 1.0, "sync_ms": 14.0},
    ]
    table = per_rank_stats(run_totals(rows))
    for rank in (0, 1):
        mine = [r for r in rows if r["rank"] == rank]
        steps = sum(r["steps"] for r in mine)
        ms = sum(r["steps"] * r["ms_per_step"] for r in mine) / steps
        sync = {k: sum(r["steps"] * r["sync_ms"] for r in rows if r["rank"] == k) / steps for k in (0, 1)}
        assert table[rank]["steps"] == steps and table[rank]["ms_per_step"] == pytest.approx(ms)
        assert table[rank]["data_pct"] == pytest.approx(100 * sum(r["steps"] * r["data_ms"] for r in mine) / steps / ms)
        assert table[rank]["wait_pct"] == pytest.approx(100 * (sync[rank] - min(sync.values())) / ms)
    assert table[0]["wait_pct"] == 0.0  # the run's fastest; its first interval waited 1 ms for rank 1
