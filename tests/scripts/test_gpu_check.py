"""scripts/gpu_check.sh (``make gpu-check``) on a machine without a GPU: a clean "no GPU: skipped" report."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = ["env", "gpu-tests", "save-load-step", "fork-launch", "demo-one-gpu", "digits-gpu", "ddp-example", "syncbn-nccl",
         "dataparallel", "horovod-adasum", "fsdp-one-gpu", "fsdp-nccl", "fsdp-consolidate", "bench-fsdp", "bench"]


@pytest.mark.timeout(180)
def test_without_a_gpu_every_gpu_step_is_skipped_and_the_check_succeeds(tmp_path):
    out = tmp_path / "report"
    # CUDA hidden, so a GPU machine runs this test the same way; this interpreter's torch,
    # as `make gpu-check PYTHON=...` would use it (nothing installed).
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu_check.sh"), str(out)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("\t") for line in (out / "summary.tsv").read_text().splitlines()]
    assert [r[0] for r in rows] == STEPS
    assert rows[0][1] == "PASS" and all(r[1] == "SKIPPED" for r in rows[1:]), rows
    report = (out / "report.md").read_text()
    assert "**no GPU: skipped**" in report and "GPUs visible: 0" in report
    assert report.count("SKIPPED (no GPU)") == len(STEPS) - 1
    assert "torch" in (out / "logs" / "env.log").read_text()
    assert sorted(os.listdir(tmp_path)) == ["report"]  # nothing written beside the report folder


def test_a_python_without_torch_is_named_with_a_hint(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named torch' >&2\nexit 1\n")
    fake.chmod(0o755)
    done = subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu_check.sh"), str(tmp_path / "out")],
                          env={**os.environ, "PYTHON": str(fake)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "cannot import torch" in done.stderr and "HINT: " in done.stderr
