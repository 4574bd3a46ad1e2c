"""What the seed tests share: start a twin the way its seed starts it, and the single-process
results to compare with, computed here from the same model and data (not by the twins)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _toy  # noqa: E402

TOL = 1e-5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet_env(**extra: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TWIN_OUT"):
        env.pop(key, None)  # a test runner started by a launcher must not pass its place on
    env.update(extra)
    return env


def run(cmd: list[str], out: Path | None = None, timeout: float = 150, cwd: Path = HERE, **env: str):
    """Run ``cmd`` (``ringtrain ...`` means this interpreter's ``-m ringtrain``); stdout+stderr, returncode."""
    if cmd[0] == "ringtrain":
        cmd = [sys.executable, "-m", "ringtrain", *cmd[1:]]
    elif cmd[0] == "python":
        cmd = [sys.executable, *cmd[1:]]
    if out is not None:
        env["TWIN_OUT"] = str(out)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=quiet_env(**env))
    return res


def ok(res) -> str:
    text = res.stdout + res.stderr
    assert res.returncode == 0, text[-4000:]
    return text


def result(out: Path) -> dict:
    return torch.load(out, weights_only=True)


def epoch_order(n: int, epoch: int, shuffle: bool = True, seed: int = 0) -> list[int]:
    """The order DistributedSampler(shuffle, seed) draws an epoch in, before ranks take every W-th."""
    if not shuffle:
        return list(range(n))
    g = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).tolist()


def reference(model, optimizer, batches, *, zero_grad: bool = True, accumulate: int = 1):
    """Train ``model`` on ``batches`` (lists of dataset indices), one process, mean cross-entropy."""
    x, y = _toy.dataset().tensors
    model.train()
    for i, idx in enumerate(batches):
        loss = F.cross_entropy(model(x[idx]), y[idx]) / accumulate
        loss.backward()
        if (i + 1) % accumulate == 0:
            optimizer.step()
            if zero_grad:
                optimizer.zero_grad()
    return model


def batches_of(order: list[int], size: int, drop_last: bool = False) -> list[list[int]]:
    out = [order[i:i + size] for i in range(0, len(order), size)]
    return [b for b in out if len(b) == size] if drop_last else out


def same_params(got: dict, model) -> float:
    """Largest difference between saved parameters and ``model``'s, matched in order (names may differ)."""
    want = list(model.state_dict().values())
    values = list(got.values())
    assert len(values) == len(want), (list(got), list(model.state_dict()))
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(values, want))


def falls(losses: list[float], by: float = 0.8) -> bool:
    return losses[-1] < by * losses[0]


def full_loss(params: dict, batchnorm: bool = False) -> float:
    """Cross-entropy of the whole toy dataset under saved ``params`` (loaded by position into ``_toy.Net``)."""
    model = _toy.Net(batchnorm)
    model.load_state_dict(dict(zip(model.state_dict(), params.values())))
    model.eval()
    x, y = _toy.dataset().tensors
    with torch.no_grad():
        return F.cross_entropy(model(x), y).item()
