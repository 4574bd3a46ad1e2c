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
