"""``ringtrain plan script.py``: the user's script, unchanged, plans and exits; a script that never gets there is
named (cli/plan.py, planning/mode.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from _launch_util import child_env

SCRIPT = """
import torch, ringtrain as rt
import torch.distributed as dist

ring = rt.Ring(strategy="fsdp", seed=0, checkpoint_dir={ckpt!r})
model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()) for _ in range(3)))
model, optimizer = ring.setup(model, torch.optim.AdamW(model.parameters()))
print("process group formed:", dist.is_initialized(), flush=True)
data = torch.utils.data.TensorDataset(torch.randn(64, 32), torch.randn(64, 32))
for x, y in ring.loader(data, batch_size=8):
    ring.backward(torch.nn.functional.mse_loss(model(x), y))
    print("trained a step", flush=True)
"""


def _plan(tmp_path, script: str, *flags: str) -> subprocess.CompletedProcess:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(script))
    return subprocess.run([sys.executable, "-m", "ringtrain", "plan", *flags, "--out", str(tmp_path / "plan"),
                           str(path)], env=child_env(), capture_output=True, text=True, timeout=240)


def test_the_script_plans_every_layout_and_exits_before_training(tmp_path):
    done = _plan(tmp_path, SCRIPT.format(ckpt=str(tmp_path / "ckpt")), "--nproc-per-node", "2",
                 "--device", "a100", "--device-memory", "40GiB")
    assert done.returncode == 0, done.stderr
    assert "process group formed: False" in done.stdout
    assert "trained a step" not in done.stdout
    assert "* fastest that fits" in done.stdout
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert plan["schema"] == "ringtrain.plan/1" and plan["world_size"] == 2 and plan["script_strategy"] == "fsdp"
    assert plan["device"] == "a100" and plan["device_memory"] == 40 * 2**30
    assert {r["layout"] for r in plan["rows"]} >= {"DDP 2", "FSDP 2", "FSDP 2 + AC full", "FSDP 2 + offload"}
    assert sum(r["fastest"] for r in plan["rows"]) == 1
    assert all(r["peak"] > 0 and r["error"] is None for r in plan["rows"])
    assert (tmp_path / "plan" / "plan.png").stat().st_size > 0
    assert not (tmp_path / "ckpt").exists()  # planning writes no checkpoint folder


def test_a_script_that_never_reaches_ring_setup_is_named(tmp_path):
    done = _plan(tmp_path, "print('no ring here')\n")
    assert done.returncode == 2
    assert "never reached ring.setup" in done.stderr
    assert "HINT:" in done.stderr
