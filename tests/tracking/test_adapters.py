"""W&B and MLflow through their own libraries, in their offline modes (issue 22); skipped when not installed."""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from _launch_util import child_env  # noqa: E402

SCRIPT = textwrap.dedent("""
    import sys
    import ringtrain as rt
    ring = rt.Ring(device="cpu", log_dir="run", log_with=[sys.argv[1]])
    for step in range(int(sys.argv[2]), int(sys.argv[3])):
        ring.log({"loss": 1.0 / step, "acc": step / 10}, step=step)
    ring.close()
""")


def run(cwd, backend: str, first: int, last: int, **env: str) -> str:
    (cwd / "log.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, "log.py", backend, str(first), str(last)], cwd=cwd, env=child_env(**env),
                          capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


@pytest.mark.timeout(360)
@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed (pip install wandb)")
def test_wandb_offline_run_gets_the_values_and_a_restart_continues_it(tmp_path):
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path), "WANDB_CONFIG_DIR": str(tmp_path)}
    assert "wandb" in run(tmp_path, "wandb", 1, 4, **env)
    run(tmp_path, "wandb", 4, 6, **env)  # the job again, in the same folder: the same W&B run
    run_id = (tmp_path / "run" / "wandb-run-id").read_text().strip()
    records = sorted(glob.glob(str(tmp_path / "run" / "wandb" / "offline-run-*" / f"run-{run_id}.wandb")))
    assert len(records) == 2, os.listdir(tmp_path / "run" / "wandb")
    data = b"".join(open(p, "rb").read() for p in records)  # W&B's own record files (protobuf: strings stay whole)
    for value in [1.0 / s for s in range(1, 6)] + [s / 10 for s in range(1, 6)]:
        assert repr(value).encode() in data, value
    assert b"loss" in data and b"acc" in data


@pytest.mark.timeout(240)
@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow is not installed (pip install mlflow-skinny)")
def test_mlflow_local_store_gets_every_step_and_a_restart_continues_the_run(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    import ringtrain as rt

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # MLflow's own local store, no server
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for first, last in ((1, 4), (4, 6)):  # the job, then the job again in the same folder: the same MLflow run
        ring = rt.Ring(device="cpu", log_dir=str(tmp_path / "run"), log_with=["mlflow"])
        for step in range(first, last):
            ring.log({"loss": 1.0 / step, "acc": step / 10}, step=step)
        ring.close()
    run_id = (tmp_path / "run" / "mlflow-run-id").read_text().strip()
    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(s, 1.0 / s) for s in range(1, 6)]
    assert [m.value for m in client.get_metric_history(run_id, "acc")] == [s / 10 for s in range(1, 6)]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_a_backend_asked_for_but_missing_is_named_before_the_job_starts(tmp_path, monkeypatch):
    import ringtrain as rt
    from ringtrain.errors import RingtrainError
    from ringtrain.tracking import adapter

    monkeypatch.setattr(adapter, "installed", lambda name: False)  # environment detection only
    with pytest.raises(RingtrainError, match="'mlflow' is not installed") as e:
        rt.Ring(device="cpu", log_dir=str(tmp_path), log_with="mlflow")
    assert "pip install mlflow" in str(e.value)
    assert adapter.backends(()) == []  # without tensorboard: metrics.csv alone
