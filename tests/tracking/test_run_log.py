"""ring.log (issue 22): the whole job's mean, one collective, one writer; the run folder's files."""

from __future__ import annotations

import csv
import os
import statistics

import pytest
import torch

import _tracking_jobs as jobs
import ringtrain as rt
from ringtrain.errors import RingtrainError
from ringtrain.tracking import default_folder

REDUCE = ("mean", "sum", "max", "min", None)


def read_csv(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.timeout(180)
def test_logged_values_are_reduced_over_every_rank_and_written_once(run_ranks, tmp_path):
    folder = tmp_path / "run"
    ranks = run_ranks(jobs.log_differently, str(folder))
    sent = [r["sent"] for r in ranks]  # per rank, per call: the values that rank logged
    calls = len(sent[0])
    assert calls == 8 and all(len(s) == calls for s in sent)
    rows = read_csv(folder / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [2 * (i + 1) for i in range(calls)]  # one row per call: one writer
    for call in range(calls):
        reduce = REDUCE[call % 5]
        for name in ("loss", "acc", "n"):
            each = [sent[rank][call][name] for rank in range(2)]
            expected = {"mean": statistics.fmean(each), "sum": sum(each), "max": max(each), "min": min(each),
                        None: each[0]}[reduce]
            for rank in range(2):  # every rank gets the reduced values back
                assert ranks[rank]["got"][call][name] == pytest.approx(expected, rel=1e-6), (call, reduce, name)
            assert float(rows[call][name]) == pytest.approx(expected, rel=1e-6), (call, reduce, name)
    assert all(c == 2 for r in ranks for c in r["calls"])  # the names' check and the matrix, per call
    for r in ranks:
        assert "other metric names on rank(s) [1]" in r["mismatch"] and "HINT:" in r["mismatch"]
        assert "acc not logged by every rank" in r["only_one"] and "HINT:" in r["only_one"], r["only_one"]
    assert len(read_csv(folder / "metrics.csv")) == calls  # the mismatched call wrote nothing
    # one writer: one event file, and per-rank step times of both ranks in ranks.csv
    assert len([f for f in os.listdir(folder) if f.startswith("events.out.tfevents")]) <= 1
    per_rank = read_csv(folder / "ranks.csv")
    assert {r["rank"] for r in per_rank} == {"0", "1"}
    assert sum(int(r["steps"]) for r in per_rank if r["rank"] == "1") >= ranks[0]["steps"] - 2
    for r in per_rank:
        parts = sum(float(r[k]) for k in ("data_ms", "compute_ms", "wait_ms"))
        assert parts == pytest.approx(float(r["ms_per_step"]), rel=1e-3, abs=1e-3)


def test_bad_values_and_options_are_named(tmp_path):
    with pytest.raises(RingtrainError, match="no backend 'tensorbord'") as e:
        rt.Ring(device="cpu", log_dir=str(tmp_path / "x"), log_with=["tensorbord"])
    assert "HINT:" in str(e.value)
    ring = rt.Ring(device="cpu", log_dir=str(tmp_path / "run"))
    for values, kw, match in (({}, {}, "non-empty dict"), ({"w": torch.ones(3)}, {}, r"shape \(3,\)"),
                              ({"w": "high"}, {}, "log numbers"), ({"w": 1.0}, {"reduce": "avg"}, "reduce='avg'"),
                              ({"w": 1.0}, {"step": -1}, "step=-1")):
        with pytest.raises(RingtrainError, match=match) as e:
            ring.log(values, **kw)
        assert "HINT:" in str(e.value)
    assert not (tmp_path / "run").exists()  # nothing logged yet: no folder made
    assert ring.log({"w": torch.tensor([2.5]), "flag": True}) == {"w": 2.5, "flag": 1.0}
    ring.close()
    assert read_csv(tmp_path / "run" / "metrics.csv")[0]["w"] == "2.5"


def test_new_metrics_add_columns_and_reopening_continues(tmp_path):
    ring = rt.Ring(device="cpu", log_dir=str(tmp_path))
    ring.log({"loss": 1.0}, step=1)
    ring.log({"val": 0.5}, step=1)
    ring.log({"loss": 0.5, "val": 0.7}, step=2)
    ring.close()
    ring.log({"loss": 0.25}, step=3)  # after close: the files reopen and continue
    ring.close()
    rows = read_csv(tmp_path / "metrics.csv")
    assert [(r["step"], r["loss"], r["val"]) for r in rows] == [("1", "1.0", ""), ("1", "", "0.5"), ("2", "0.5", "0.7"),
                                                               ("3", "0.25", "")]


def test_default_folders():
    assert default_folder("given", "ckpt") == "given"
    assert default_folder(None, "out/ckpt/") == "out/ckpt-log"  # a restarted job finds it again
    made = default_folder(None, None)
    assert made.startswith(os.path.join("runs", "")) and made.count("-") >= 2


BAR_AND_LOG = """
import torch, torch.nn.functional as F
import ringtrain as rt
ring = rt.Ring(device="cpu", seed=0, log_dir={folder!r})
net = torch.nn.Linear(4, 2)
net, opt = ring.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
for x, y in ring.progress(ring.loader(data, batch_size=4)):
    loss = F.cross_entropy(net(x), y)
    ring.backward(loss); opt.step(); opt.zero_grad()
    if ring.optimizer_steps % 4 == 0:
        ring.log({{"loss": loss}})
"""


@pytest.mark.timeout(120)
def test_the_logging_to_line_is_a_line_of_its_own_under_the_progress_bar(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(BAR_AND_LOG.format(folder=str(tmp_path / "run")))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stderr.split("\n") if "logging to" in line)
    # What the terminal shows of that line is what follows its last carriage return: the bar was cleared first.
    assert line.split("\r")[-1].startswith("ringtrain: logging to"), repr(line)
