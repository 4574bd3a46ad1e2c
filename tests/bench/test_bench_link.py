"""`ringtrain bench --comm` and `--link`: bad values exit 2 with a HINT; the all-reduce table with
and without a shaped link; the training table records the link (real ranks, real namespaces)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from ringtrain.bench import netlink
from ringtrain.bench.cli import main

NEEDS_LINK = pytest.mark.skipif(netlink.link_available() is not None, reason=str(netlink.link_available()))


def _bench(*argv: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtrain", "bench", "--no-progress", *argv],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("argv, needle", [
    (["--comm", "--link", "1gigabit"], "not a rate"),
    (["--link", "1gbit,fast"], "not a delay"),
    (["--comm", "--nprocs", "1"], "at least 2 processes"),
    (["--link", "1gbit", "--preset", "gpu"], "NVLink"),
])
def test_bad_link_and_comm_arguments_exit_2_with_a_hint(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "HINT:" in err


def _rows(out) -> list[dict]:
    with open(out / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.timeout(120)
def test_comm_on_the_plain_loopback(tmp_path):
    done = _bench("--comm", "--quick", "--out", str(tmp_path), "--timeout", "100", timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(tmp_path)
    assert [int(r["bytes"]) for r in rows] == [64 * 1024 * 4**i for i in range(5)]
    for r in rows:  # two ranks: busbw = algbw x 2(n-1)/n = algbw
        assert float(r["busbw_gbit_s"]) == pytest.approx(float(r["algbw_gbit_s"])) and float(r["busbw_gbit_s"]) > 0
        assert r["link"] == "" and r["link_pct"] == ""
    assert "plain loopback" in done.stdout and "% of link" not in done.stdout


@NEEDS_LINK
@pytest.mark.timeout(120)
def test_comm_through_a_1gbit_link_reaches_most_of_it_for_large_messages(tmp_path):
    before = set(os.listdir("/run/netns"))
    done = _bench("--comm", "--quick", "--link", "1gbit", "--out", str(tmp_path), "--timeout", "100", timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(tmp_path)
    assert all(r["link"] == "1gbit" for r in rows) and "% of link" in done.stdout
    large = [float(r["busbw_gbit_s"]) for r in rows if int(r["bytes"]) >= 4 * 2**20]
    assert large and all(0.8 <= bw <= 1.1 for bw in large), large  # a loaded CI box: a wide band
    with open(tmp_path / "results.json") as f:
        assert json.load(f)["meta"]["link_rate_bps"] == 1e9
    assert set(os.listdir("/run/netns")) <= before


@NEEDS_LINK
@pytest.mark.timeout(150)
def test_the_training_table_records_its_link(tmp_path):
    done = _bench("--workload", "digits-cnn", "--modes", "ddp", "--nprocs", "2", "--precision", "32", "--steps", "2",
                  "--warmup", "1", "--repeats", "1", "--width", "4", "--batch-size", "32", "--device", "cpu",
                  "--out", str(tmp_path), "--timeout", "120", "--link", "100mbit")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ranks behind --link 100mbit" in done.stdout
    assert [(r["mode"], r["status"], r["link"]) for r in _rows(tmp_path)] == [("ddp", "ok", "100mbit")]
    with open(tmp_path / "results.json") as f:
        assert json.load(f)["meta"]["link"] == "100mbit"
