"""`ringtrain bench` end to end: real processes, a tiny configuration, every mode requested.

One run of the command (module fixture) on 1 and 2 Gloo ranks; the tests read its
stdout, results.csv, results.json and throughput.png.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from ringtrain.bench.modes import MODES
from ringtrain.bench.report import CSV_COLUMNS

STEPS, BATCH, REPEATS = 2, 32, 2


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    argv = [sys.executable, "-m", "ringtrain", "bench", "--workload", "digits-cnn", "--modes", ",".join(MODES),
            "--nprocs", "2", "--precision", "32", "--steps", str(STEPS), "--warmup", "1", "--repeats", str(REPEATS),
            "--width", "4", "--batch-size", str(BATCH), "--accumulate", "2", "--out", str(out), "--no-progress",
            "--timeout", "150"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=170)
    with open(out / "results.json") as f:
        results = json.load(f)
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {"done": done, "out": out, "json": results, "csv": rows}


@pytest.mark.timeout(200)
def test_every_requested_mode_has_a_row_and_none_failed(bench):
    rows = bench["csv"]
    assert {r["mode"] for r in rows} == set(MODES), bench["done"].stderr[-3000:]
    failed = [(r["mode"], r["reason"]) for r in rows if r["status"] == "failed"]
    assert not failed, failed
    assert bench["done"].returncode == 0, bench["done"].stderr[-3000:]
    for mode in ("single", "ddp", "ddp+accumulate", "ddp+ac", "tp", "raw-ddp"):
        assert any(r["mode"] == mode and r["status"] == "ok" for r in rows), mode
    # Activation checkpointing recomputes the same forward, and tensor parallelism cuts the same Linears: both train
    # the model ddp trains (the same seed, batches and steps), to float32's rounding.
    loss = {r["mode"]: float(r["final_loss"]) for r in rows if r["status"] == "ok"}
    for mode in ("ddp+ac", "tp"):
        assert abs(loss[mode] - loss["ddp"]) <= 1e-4 * abs(loss["ddp"]), (mode, loss)
    for r in rows:
        assert r["status"] in ("ok", "skipped"), r
        assert r["status"] == "ok" or r["reason"], f"{r['mode']} skipped without a reason"


@pytest.mark.timeout(200)
def test_csv_json_and_png_are_well_formed(bench):
    with open(bench["out"] / "results.csv", newline="") as f:
        assert next(csv.reader(f)) == CSV_COLUMNS
    for r in bench["csv"]:
        if r["status"] != "ok":
            continue
        columns = ["epoch_s", "samples_per_s", "peak_mem_mib", "final_loss", "scaling_efficiency"]
        if r["mode"] != "pipeline":  # a pipeline rank holds one stage: nothing to evaluate on its own
            columns.append("metric")
        if r["processes"] == "2":  # raw-ddp ran with 2 processes only
            columns.append("ratio_vs_raw_ddp")
        for column in columns:
            assert float(r[column]) > 0, (r["mode"], column, r[column])
        assert int(r["repeats"]) == REPEATS
    data = bench["json"]
    assert set(data) == {"meta", "rows", "runs"}
    assert data["meta"]["workload"] == "digits-cnn" and data["meta"]["timed_steps"] == STEPS
    assert len(data["rows"]) == len(bench["csv"])
    png = bench["out"] / "throughput.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(str(png)).shape[0] > 100
    table = bench["done"].stdout
    assert "samples/s" in table and "vs raw-ddp" in table and "wrote" in table


@pytest.mark.timeout(200)
def test_dp_without_gpus_is_listed_as_skipped_with_the_reason(bench):
    dp = [r for r in bench["csv"] if r["mode"] == "dp"]
    assert len(dp) == 1 and dp[0]["status"] == "skipped"
    assert "GPU" in dp[0]["reason"]
    assert "dp" in bench["done"].stdout and "SKIPPED" in bench["done"].stdout


@pytest.mark.timeout(200)
def test_every_mode_sees_the_same_samples_and_global_batch(bench):
    ran = [r for r in bench["json"]["runs"] if r["status"] == "ok"]
    by_mode = {r["mode"] for r in ran}
    assert {"ddp", "raw-ddp", "ddp+accumulate", "single"} <= by_mode
    for r in ran:
        # Every run of every mode: STEPS optimizer steps of the same global batch, counted by the ranks.
        assert r["samples"] == STEPS * BATCH, (r["mode"], r["samples"])
        assert r["global_batch"] == BATCH and r["optimizer_steps"] == STEPS
    ddp = [r["samples"] for r in ran if r["mode"] == "ddp"]
    raw = [r["samples"] for r in ran if r["mode"] == "raw-ddp"]
    assert ddp == raw and len(ddp) == REPEATS


@pytest.mark.timeout(200)
def test_ringtrain_ddp_and_raw_ddp_train_the_same_model(bench):
    # Same seed, same sampler order, same global batch: the loop is the only difference.
    rows = {(r["mode"], r["processes"]): r for r in bench["json"]["rows"] if r["status"] == "ok"}
    ddp, raw = rows[("ddp", 2)], rows[("raw-ddp", 2)]
    assert ddp["final_loss"] == pytest.approx(raw["final_loss"], rel=1e-4)
    assert ddp["metric"] == pytest.approx(raw["metric"], abs=1e-6)
    assert ddp["comm_bytes_per_step"] == raw["comm_bytes_per_step"] > 0
    accumulate = rows[("ddp+accumulate", 2)]
    assert accumulate["allreduces_per_step"] == ddp["allreduces_per_step"]  # no_sync: once per optimizer step


@pytest.mark.timeout(200)
def test_one_process_communicates_nothing_in_every_mode(tmp_path):
    # DDP's hook still runs at W=1 (it reported 591 KiB/step) while hvd's estimate said 0 B: at W=1
    # nothing crosses a wire, whichever way a mode counts its bytes.
    argv = [sys.executable, "-m", "ringtrain", "bench", "--workload", "digits-cnn", "--modes", "ddp,hvd,raw-ddp",
            "--nprocs", "1", "--precision", "32", "--steps", "2", "--warmup", "1", "--repeats", "1", "--width", "4",
            "--batch-size", "32", "--out", str(tmp_path), "--no-progress", "--timeout", "150"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "results.json") as f:
        rows = {r["mode"]: r for r in json.load(f)["rows"]}
    assert set(rows) == {"ddp", "hvd", "raw-ddp"}
    for mode, row in rows.items():
        assert row["world_size"] == 1 and row["comm_bytes_per_step"] == 0, (mode, row)


def test_output_folder_is_reported(bench):
    assert str(bench["out"]) in bench["done"].stdout
    assert os.path.isfile(bench["out"] / "results.json")


# --- --sync-bn: seed 004's timings had SyncBatchNorm on -------------------------------------------

SYNC_MODES = "single,ddp,pipeline,raw-ddp"


@pytest.fixture(scope="module")
def syncbn(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-syncbn")
    argv = [sys.executable, "-m", "ringtrain", "bench", "--workload", "cifar-resnet18", "--quick", "--sync-bn",
            "--modes", SYNC_MODES, "--nprocs", "2", "--precision", "32", "--steps", "2", "--warmup", "1",
            "--repeats", "1", "--width", "8", "--batch-size", "32", "--out", str(out),
            "--no-progress", "--timeout", "150"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(out / "results.json") as f:
        return {"done": done, "json": json.load(f)}


@pytest.mark.timeout(200)
def test_sync_bn_trains_with_synchronised_batchnorm_in_every_mode(syncbn):
    runs = {r["mode"]: r for r in syncbn["json"]["runs"] if r["status"] == "ok"}
    assert set(runs) == {"single", "ddp", "raw-ddp"}
    # Converted in every mode: ringtrain's layer (on CPU/Gloo, where torch's SyncBatchNorm refuses CPU tensors)
    for mode in ("single", "ddp", "raw-ddp"):
        assert runs[mode]["norm_layers"] == ["ringtrain.parallel.syncbn.SyncBatchNorm"], (mode, runs[mode]["norm_layers"])
    # Statistics over the global batch: 2 ranks x 16 train the model 1 process x 32 trains. Measured in this
    # configuration, relative to single: on one CPU (Intel) equal to the last digit with --sync-bn and 5.6e-4
    # apart with per-rank BatchNorm; on another (AMD EPYC, 2026-11) 2.2e-4 with --sync-bn (float rounding of
    # 3 SGD steps, different kernels) and 1.5e-3 with per-rank BatchNorm. The exact equivalence of the layer
    # itself is tests/test_syncbn.py's; here a bound that per-rank statistics exceed on both.
    single, ddp, raw = (runs[m]["final_loss"] for m in ("single", "ddp", "raw-ddp"))
    assert ddp == pytest.approx(single, rel=5e-4) and raw == pytest.approx(ddp, rel=1e-6)
    assert syncbn["json"]["meta"]["config"]["sync_bn"] is True
    skipped = [r for r in syncbn["json"]["rows"] if r["mode"] == "pipeline"]
    assert skipped[0]["status"] == "skipped" and "sync_batchnorm" in skipped[0]["reason"]


@pytest.mark.timeout(200)
def test_sync_bn_prints_the_table_in_seed_004s_shape(syncbn):
    out = syncbn["done"].stdout
    assert "SyncBatchNorm in every mode (--sync-bn)" in out
    seed = out[out.index("In seed 004's shape"):].splitlines()
    assert "SyncBatchNorm on in every mode" in seed[0]
    assert seed[1] == "|model|dataset|training method|time(seconds/epoch)|Top-1 accuracy"
    rows = [line.split("|")[1:] for line in seed[3:] if line.startswith("|")]
    assert [r[2] for r in rows] == ["single process", "DDP x2", "DDP (hand-written loop) x2"]
    for model, dataset, _, seconds, accuracy in rows:
        assert (model, dataset) == ("ResNet-18 (width 8)", "synthetic CIFAR-100-shaped")
        assert seconds.endswith("s") and float(seconds[:-1]) > 0 and 0 <= float(accuracy) <= 1
