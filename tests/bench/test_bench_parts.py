"""The bench's parts without launching processes: arguments, workloads, skips, statistics, failures."""

from __future__ import annotations

import json

import pytest
import torch

import ringtrain
from ringtrain.bench import cli, modes, report, runner, stats, workloads
from ringtrain.bench.models import UNet3D
from ringtrain.errors import RingtrainError
from ringtrain.parallel.stages import cuttable_names


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--nprocs", "0"], "--nprocs"),
        (["--nprocs", "1,x"], "'1,x'"),
        (["--modes", "ddp,warp"], "warp"),
        (["--precision", "fp8"], "fp8"),
        (["--repeats", "0"], "--repeats 0"),
        (["--workload", "mlp", "--data", "/tmp"], "--data"),
        (["--workload", "cifar-resnet18", "--data", "/nonexistent"], "'train'"),
    ],
)
def test_bad_arguments_exit_2_with_a_hint(capsys, argv, needle):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "HINT:" in err


def test_epochs_and_steps_together_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--epochs", "1", "--steps", "3"])
    assert exit_info.value.code == 2
    assert "HINT:" in capsys.readouterr().err


def test_underscore_spellings_are_accepted_but_not_listed(capsys):
    args = cli.parser().parse_args(["--batch_size", "8", "--threads_per_rank", "2", "--no_progress"])
    assert args.batch_size == 8 and args.threads_per_rank == 2 and args.no_progress
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--batch-size" in out and "--batch_size" not in out and "Failure modes" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for machines without CUDA")
def test_gpu_preset_without_cuda_is_a_clear_error(capsys):
    assert cli.main(["--preset", "gpu", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert "--preset gpu measures CUDA GPUs" in err and "sees none" in err
    assert "HINT:" in err and "ringtrain bench --quick" in err


def test_bench_is_a_ringtrain_command(capsys):
    from ringtrain import cli as top

    assert top.COMMANDS["bench"].module == "ringtrain.bench.cli"
    assert top.main(["--help"]) == 0
    assert "bench" in capsys.readouterr().out


@pytest.mark.parametrize("name", workloads.WORKLOADS)
def test_quick_workloads_build_train_and_cut(name):
    wl = workloads.build(name, quick=True)
    assert len(wl.train) % wl.global_batch == 0 and len(wl.train) >= wl.global_batch
    model = wl.make_model()
    x, y = wl.train.tensors
    loss = wl.loss(model(x[:2]), y[:2])
    loss.backward()
    assert torch.isfinite(loss)
    assert 0.0 <= wl.evaluate(model, torch.device("cpu")) <= 1.0
    if wl.split_at is None:
        assert name in workloads.NO_PIPELINE
    else:
        assert set(wl.split_at) <= set(cuttable_names(model))


def test_mlp_is_a_few_million_parameters_and_resnet18_the_standard_size():
    assert 2e6 < workloads.build("mlp", quick=False, samples=256).params < 6e6
    resnet = workloads._resnet18(64)
    assert sum(p.numel() for p in resnet.parameters()) == pytest.approx(11.2e6, rel=0.01)


def test_unet3d_segments_volumes():
    out = UNet3D(1, 2, base=4, depth=2)(torch.randn(2, 1, 16, 16, 16))
    assert out.shape == (2, 2, 16, 16, 16)


def test_static_skips_say_why():
    assert "0" in modes.static_skip("dp", 1, "mlp", cuda_devices=0, accumulate=4, batch=64)
    assert modes.static_skip("dp", 1, "mlp", cuda_devices=2, accumulate=4, batch=64) is None
    assert "U-Net" in modes.static_skip("pipeline", 2, "unet3d", 0, 4, 64)
    assert "multiple of 2" in modes.static_skip("pipeline", 1, "mlp", 0, 4, 64)
    assert "micro-batches" in modes.static_skip("pipeline", 2, "mlp", 0, 4, 30)
    assert "3 processes" in modes.static_skip("ddp+accumulate", 3, "mlp", 0, 4, 64)
    assert "GPUs" in modes.static_skip("ddp", 4, "mlp", 2, 4, 64)
    assert modes.static_skip("ddp+accumulate", 2, "mlp", 0, 4, 64) is None


def _run(mode, procs, repeat, rate, precision="32", devices=None):
    return {"status": "ok", "mode": mode, "processes": procs, "devices": devices or procs, "precision": precision,
            "repeat": repeat, "samples_per_s": rate, "epoch_samples": 1000, "peak_mem_mib": 100.0 + repeat,
            "memory_method": "m", "comm_bytes_per_step": 10.0, "allreduces_per_step": 1.0, "comm_method": "hook",
            "final_loss": 1.0, "metric": 0.5, "samples": 64, "global_batch": 32.0, "optimizer_steps": 2}


def test_summary_pairs_ratios_by_repeat_and_scales_against_one_process():
    records = [
        _run("single", 1, 0, 100.0), _run("single", 1, 1, 120.0), _run("single", 1, 2, 80.0),
        _run("ddp", 2, 0, 190.0), _run("raw-ddp", 2, 0, 200.0),
        _run("ddp", 2, 1, 100.0), _run("raw-ddp", 2, 1, 100.0),  # a slow moment hits both
        _run("ddp", 2, 2, 300.0), _run("raw-ddp", 2, 2, 310.0),
        {"status": "skipped", "mode": "hvd", "processes": 1, "precision": "32", "reason": "not here"},
        {"status": "skipped", "mode": "hvd", "processes": 2, "precision": "32", "reason": "not here"},
    ]
    rows = {(r["mode"], r["processes"]): r for r in stats.summarize(records, ["32"])}
    ddp = rows[("ddp", 2)]
    assert ddp["samples_per_s"] == 190.0 and ddp["samples_per_s_min"] == 100.0
    assert ddp["ratio_vs_raw_ddp"] == pytest.approx(sorted([0.95, 1.0, 300 / 310])[1])
    assert ddp["scaling_efficiency"] == pytest.approx(190.0 / (2 * 100.0))  # against single, the one base
    assert rows[("raw-ddp", 2)]["scaling_efficiency"] == pytest.approx(200.0 / (2 * 100.0))
    assert ddp["epoch_s"] == pytest.approx(1000 / 190.0)
    assert ddp["peak_mem_mib"] == 102.0 and ddp["repeats"] == 3
    assert rows[("hvd", "1,2")]["status"] == "skipped" and rows[("hvd", "1,2")]["reason"] == "not here"
    text = report.table(list(rows.values()), {"metric_name": "accuracy"})
    assert "SKIPPED (W=1,2, precision 32): not here" in text


def test_summary_shows_a_sample_count_disagreement():
    a, b = _run("ddp", 2, 0, 1.0), _run("ddp", 2, 1, 1.0)
    b["samples"] = 65
    (row,) = stats.summarize([a, b], ["32"])
    assert row["samples"] == [64, 65]


def test_a_crashing_mode_is_failed_and_the_others_run_again(monkeypatch, tmp_path):
    calls = []

    def fake_launch(fn, nprocs, args, timeout):
        cfg, pending, journal = args
        calls.append(list(pending))
        if "ddp" in pending:
            with open(journal, "a") as f:
                f.write(json.dumps({"mode": "raw-ddp", "precision": "32", "repeat": 0}) + "\n")
                f.write(json.dumps({"mode": "ddp", "precision": "32", "repeat": 0}) + "\n")
            raise RingtrainError("rank 1 (pid 7) of launch(worker, nprocs=2) raised; the other ranks were stopped.\n"
                                 "Traceback (most recent call last):\n  File x\nValueError: boom in ddp", "fix it")
        return [{"meta": {"workload": "mlp"}, "records": [_run(m, nprocs, 0, 1.0) for m in pending]}]

    monkeypatch.setattr(ringtrain, "launch", fake_launch)
    cfg = runner.Config(workload="mlp", modes=["ddp", "raw-ddp"], nprocs=[2], precisions=["32"], quick=True)
    result = runner.run(cfg, str(tmp_path))
    assert calls == [["ddp", "raw-ddp"], ["raw-ddp"]]
    failed = [r for r in result["records"] if r["status"] == "failed"]
    assert [(r["mode"], r["reason"]) for r in failed] == [("ddp", "ValueError: boom in ddp")]
    assert [r["mode"] for r in result["records"] if r["status"] == "ok"] == ["raw-ddp"]


def test_a_launch_that_dies_before_any_run_is_an_error(monkeypatch, tmp_path):
    def fake_launch(fn, nprocs, args, timeout):
        raise RingtrainError("rank 0 exited with code 1", "see above")

    monkeypatch.setattr(ringtrain, "launch", fake_launch)
    with pytest.raises(RingtrainError, match="exited"):
        runner.run(runner.Config(workload="mlp", modes=["ddp"], nprocs=[2], quick=True), str(tmp_path))


def test_a_rank_synchronizes_only_the_gpus_its_mode_runs_on(monkeypatch):
    # Four GPUs, simulated: the CUDA queries are replaced (no GPU here). A ddp rank on cuda:1
    # waits for cuda:1 only; dp's one process waits for the GPUs its replicas run on.
    from types import SimpleNamespace

    from ringtrain.parallel import environments
    from ringtrain.bench.runner import cuda_devices_of
    from ringtrain.strategies import DataParallel

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    cuda = lambda i: torch.device("cuda", i)  # noqa: E731
    dp = DataParallel().attach(environments.detect({}, []))
    raw_ddp = SimpleNamespace(device=cuda(1))
    ring_ddp = SimpleNamespace(device=cuda(1), ring=SimpleNamespace(strategy=SimpleNamespace(devices=[cuda(1)])))
    ring_dp = SimpleNamespace(device=cuda(0), ring=SimpleNamespace(strategy=dp))
    assert cuda_devices_of(raw_ddp) == [cuda(1)]
    assert cuda_devices_of(ring_ddp) == [cuda(1)]  # only dp's replicas span several GPUs
    assert cuda_devices_of(ring_dp) == [cuda(0), cuda(1), cuda(2), cuda(3)]
    assert cuda_devices_of(SimpleNamespace(device=torch.device("cpu"))) == []


def test_sync_bn_needs_a_workload_with_batchnorm(capsys):
    assert cli.main(["--workload", "digits-cnn", "--sync-bn"]) == 2
    err = capsys.readouterr().err
    assert "no BatchNorm layer" in err and "HINT: use a workload with BatchNorm (cifar-resnet18, unet3d" in err
    # the list of workloads with BatchNorm is their models' truth
    for name in workloads.WORKLOADS:
        model = workloads.build(name, quick=True, samples=64, batch_size=16).make_model()
        assert workloads.has_batchnorm(model) == (name in workloads.WITH_BATCHNORM), name


def test_training_methods_in_seed_004s_words():
    row = {"mode": "ddp", "world_size": 4, "precision": "16-mixed", "status": "ok", "epoch_s": 14.5, "metric": 0.5}
    assert report.training_method(row) == "DDP x4+AMP fp16"  # the seed's "DDP+apex"
    assert report.training_method({**row, "mode": "dp", "world_size": 2, "precision": "32"}) == "DP x2"  # 2 GPUs
    assert report.training_method({**row, "mode": "ddp", "world_size": 1, "precision": "32"}) == "DDP x1"
    assert report.training_method({**row, "mode": "single", "world_size": 1, "precision": "bf16-mixed"}) == \
        "single process+AMP bf16"
    meta = {"model": "ResNet-18 (width 64)", "dataset": "CIFAR-100", "metric_name": "accuracy",
            "device_name": "4 x 2080Ti", "config": {"sync_bn": True}}
    skipped = {"mode": "pipeline", "status": "skipped", "reason": "x"}
    assert report.seed_table([row, skipped], meta).splitlines() == [
        "In seed 004's shape (SyncBatchNorm on in every mode; 4 x 2080Ti):",
        "|model|dataset|training method|time(seconds/epoch)|Top-1 accuracy",
        "|:---:|:---:|:---:|:---:|:---:",
        "|ResNet-18 (width 64)|CIFAR-100|DDP x4+AMP fp16|14.50s|0.500",
    ]


def _row(mode, world, rate, status="ok", reason=""):
    return {"status": status, "mode": mode, "world_size": world, "precision": "32", "samples_per_s": rate,
            "samples_per_s_min": rate and rate * 0.9, "samples_per_s_max": rate and rate * 1.1, "reason": reason}


@pytest.mark.parametrize("device, counted", [("cpu", "processes"), ("cuda:0", "GPUs")])
def test_the_plot_draws_raw_ddp_as_the_reference_and_names_what_did_not_run(tmp_path, device, counted):
    import matplotlib.pyplot as plt

    from ringtrain.bench import plot

    rows = [_row("single", 1, 100.0), _row("ddp", 2, 180.0), _row("raw-ddp", 2, 190.0), _row("hvd", 2, 170.0),
            _row("dp", "1,2", None, "skipped", "Ring(strategy=DataParallel()): dp needs CUDA GPUs; torch sees 0"),
            _row("pipeline", 1, None, "skipped", "pipeline needs a multiple of 2 processes")]
    fig = plot.figure(rows, {"workload": "mlp", "device": device})
    (ax,) = fig.axes
    (legend,) = fig.legends
    assert legend.get_title().get_text() == counted  # W counts CPU processes on CPU, not "devices"
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [tuple(line.get_ydata()) for line in dashed] == [(190.0, 190.0)]  # raw-ddp at W=2, across the panel
    assert "raw-ddp W=2 (hand-written DDP)" in [t.get_text() for t in legend.get_texts()]
    under = "\n".join(t.get_text() for t in fig.texts)
    assert "dp (W=1,2, precision 32) skipped: Ring(strategy=DataParallel()): dp needs CUDA GPUs" in under
    assert "pipeline (W=1, precision 32) skipped" in under
    plt.close(fig)
    png = plot.throughput_png(rows, {"workload": "mlp", "device": device}, str(tmp_path / "t.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_legend_covers_no_panel_and_no_note():
    """Issue 33, item 8: with a bf16 panel beside the float32 one, the legend (inside the last panel, "best") sat
    on the bf16 panel's bars. One legend for the figure now, in a row of its own between the panels and the notes."""
    import matplotlib.pyplot as plt

    from ringtrain.bench import plot

    rows = [{**_row(mode, world, rate), "precision": precision} for precision in ("32", "bf16-mixed")
            for mode, world, rate in (("single", 1, 140.0), ("ddp", 1, 125.0), ("ddp", 2, 60.0), ("hvd", 2, 50.0),
                                      ("raw-ddp", 1, 128.0), ("raw-ddp", 2, 62.0))]
    rows.append(_row("dp", "1,2", None, "skipped", "DataParallel splits each batch over the GPUs of one process"))
    fig = plot.figure(rows, {"workload": "digits-cnn", "device": "cpu"})
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    assert len(fig.axes) == 2 and not any(ax.get_legend() for ax in fig.axes)
    for ax in fig.axes:
        assert not box.overlaps(ax.get_tightbbox(renderer)), (box, ax.get_title())  # its bars and mode names
    for note in fig.texts:
        assert not box.overlaps(note.get_window_extent(renderer)), note.get_text()
    plt.close(fig)
