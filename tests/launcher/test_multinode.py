"""Training across two "nodes" on loopback, each started by its own `ringtrain run`, as users do."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap

import _ring_jobs as jobs
import pytest
import torch
from _launch_util import free_port  # noqa: E402

pytestmark = pytest.mark.timeout(240)

HERE = os.path.dirname(os.path.abspath(__file__))
HELPERS = os.path.join(os.path.dirname(HERE), "helpers")


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    env["PYTHONPATH"] = os.pathsep.join([HELPERS, env.get("PYTHONPATH", "")])
    return env


def test_two_nodes_on_loopback_train_like_one_process(tmp_path):
    out = tmp_path / "params.pt"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import torch, _ring_jobs as jobs, ringtrain as rt
        params = jobs.train(8, 2)
        import os
        if os.environ["RANK"] == "0":
            torch.save(params, {str(out)!r})
    """))
    port = str(free_port())
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "ringtrain", "run", "--nnodes", "2", "--node-rank", str(rank),
             "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port, "--timeout", "60",
             str(script)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
        )
        for rank in (0, 1)
    ]
    for node in nodes:
        _, err = node.communicate(timeout=200)
        assert node.returncode == 0, err
    assert (torch.load(out) - jobs.train(16, 2)).abs().max().item() <= 1e-5


def test_digits_demo_reaches_95_percent(tmp_path):
    demo = os.path.join(HERE, "..", "..", "examples", "digits.py")
    res = subprocess.run(
        [sys.executable, "-m", "ringtrain", "run", "--nproc-per-node", "2", demo, "--epochs", "6",
         "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=220, env=_env(),
    )
    assert res.returncode == 0, res.stderr
    accuracy = float(res.stdout.split("final held-out accuracy")[1].split(";")[0])
    assert accuracy >= 0.95
    raw = torch.load(tmp_path / "run" / "checkpoint.pt")
    assert raw["epoch"] == 5 and not any(k.startswith("module.") for k in raw["model"])
    # the demo logs through ring.log (issue 22): one log of the whole job, and its pictures
    with open(tmp_path / "run" / "log" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    accuracies = [float(r["held_out_accuracy"]) for r in rows if r["held_out_accuracy"]]
    assert len(accuracies) == 6 and accuracies[-1] == pytest.approx(accuracy, abs=1e-4)
    assert len([r for r in rows if r["loss"]]) >= 6 * 4
    assert {"curves.png", "ranks.png"} <= set(os.listdir(tmp_path / "run" / "log"))
