"""A job killed with SIGKILL and started again continues the same log: every step once (issue 22)."""

from __future__ import annotations

import csv
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from _launch_util import child_env  # noqa: E402

STEPS, KILL_AT, SAVE_EVERY = 16, 10, 4

SCRIPT = textwrap.dedent(f"""
    import os, signal
    import torch, torch.nn.functional as F
    import ringtrain as rt
    ring = rt.Ring(device="cpu", seed=0, checkpoint_dir="ckpt", save_every={SAVE_EVERY})
    net = torch.nn.Linear(4, 2)
    net, opt = ring.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    data = torch.utils.data.TensorDataset(torch.randn({4 * STEPS}, 4), torch.randint(0, 2, ({4 * STEPS},)))
    for epoch in ring.epochs(1):
        for x, y in ring.loader(data, batch_size=4):
            loss = F.cross_entropy(net(x), y)
            ring.backward(loss)
            opt.step(); opt.zero_grad()
            ring.log({{"loss": loss, "epoch": epoch}})
            if ring.optimizer_steps == int(os.environ.get("KILL_AT", -1)):
                os.kill(os.getpid(), signal.SIGKILL)  # past the checkpoint of step {KILL_AT - KILL_AT % SAVE_EVERY}
    ring.close()
""")


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("resume")
    (cwd / "train.py").write_text(SCRIPT)
    first = subprocess.run([sys.executable, "train.py"], cwd=cwd, env=child_env(KILL_AT=str(KILL_AT)),
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    with open(cwd / "ckpt-log" / "metrics.csv") as f:
        before = [int(r["step"]) for r in csv.DictReader(f)]
    second = subprocess.run([sys.executable, "train.py"], cwd=cwd, env=child_env(), capture_output=True, text=True,
                            timeout=120)
    assert second.returncode == 0, second.stderr[-2000:]
    return cwd / "ckpt-log", before, second.stdout + second.stderr


@pytest.mark.timeout(240)
def test_csv_after_kill_9_has_every_step_once(killed_and_resumed):
    folder, before, output = killed_and_resumed
    assert before == list(range(1, KILL_AT + 1))  # what the killed run had written: flushed row by row
    resumed = KILL_AT - KILL_AT % SAVE_EVERY
    dropped = f"({KILL_AT - resumed} row(s) the run before logged past that step dropped"
    assert f"continuing after step {resumed} {dropped}" in output, output
    with open(folder / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    assert all(r["loss"] and r["epoch"] == "0.0" for r in rows)
    with open(folder / "ranks.csv") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f)]
    assert steps == sorted(steps) and len(steps) == len(set(steps))


@pytest.mark.timeout(240)
@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="tensorboard is not installed (pip install 'ringtrain[track]')")
def test_tensorboard_reads_every_step_once(killed_and_resumed):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder, _, _ = killed_and_resumed
    assert len([f for f in os.listdir(folder) if f.startswith("events.out.tfevents")]) == 2  # one per run
    events = EventAccumulator(str(folder))
    events.Reload()
    assert {"loss", "epoch"} <= set(events.Tags()["scalars"])
    with open(folder / "metrics.csv") as f:
        logged = {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f)}
    scalars = events.Scalars("loss")
    assert [s.step for s in scalars] == list(range(1, STEPS + 1))  # the cut-off run's steps 9, 10 purged
    assert [s.value for s in scalars] == pytest.approx([logged[s.step] for s in scalars], rel=1e-6)
