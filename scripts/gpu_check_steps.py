"""The steps of scripts/gpu_check.sh that are Python, one per subcommand; each prints "ok" or raises.

    python scripts/gpu_check_steps.py save-load-step FOLDER   # issue 15, item 2
    python scripts/gpu_check_steps.py fork-launch NPROCS      # issue 15, item 4

Run with the repository's src/ on PYTHONPATH (gpu_check.sh sets it); needs a CUDA GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch import nn


def save_load_step(folder: str) -> None:
    """Train on the GPU, save, read the file on a CPU-only process, resume on the GPU, step again.

    Expected: the file holds CPU tensors (plain torch.load works with CUDA hidden); after
    ring.load the RNG streams continue as saved, Adam's step counters stay on the CPU and
    its moments on the GPU, and the next step runs.
    """
    import ringtrain as rt

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "gpu.pt")
    torch.manual_seed(0)
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))

    def build() -> tuple:
        ring = rt.Ring(device="cuda", seed=0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        model, optimizer = ring.setup(model, torch.optim.Adam(model.parameters(), lr=1e-3))
        return ring, model, optimizer

    def step(ring, model, optimizer) -> None:
        ring.backward(F.cross_entropy(model(x.to(ring.device)), y.to(ring.device)))
        optimizer.step()
        optimizer.zero_grad()

    ring, model, optimizer = build()
    assert ring.device.type == "cuda", ring.device
    step(ring, model, optimizer)
    ring.save(path, model=model, optimizer=optimizer)
    after_save = torch.rand(3)  # what the restored CPU RNG must draw again
    ring.close()

    cpu_only = subprocess.run(
        [sys.executable, "-c",
         "import sys, torch; ckpt = torch.load(sys.argv[1]);"
         "devices = {t.device.type for t in ckpt['model'].values()};"
         "assert devices == {'cpu'}, devices; print('loaded on a CPU-only process')", path],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True, timeout=120,
    )
    assert cpu_only.returncode == 0, cpu_only.stderr[-2000:]

    ring, model, optimizer = build()
    ring.load(path, model=model, optimizer=optimizer)
    assert torch.equal(torch.rand(3), after_save), "the RNG state was not restored"
    for state in optimizer.state.values():
        assert state["step"].device.type == "cpu", state["step"].device
        assert state["exp_avg"].device == ring.device, state["exp_avg"].device
    step(ring, model, optimizer)
    ring.close()
    print("ok: saved on", torch.cuda.get_device_name(0), "- CPU tensors on disk, resumed and stepped on the GPU")


def _fork_rank() -> dict:
    import ringtrain as rt

    ring = rt.Ring()
    total = ring.all_reduce(torch.ones(1, device=ring.device), op="sum")
    out = {"rank": ring.rank, "device": str(ring.device), "sum": total.item()}
    ring.close()
    return out


def fork_launch(nprocs: int) -> None:
    """rt.launch(start_method="fork") from a parent that has not touched CUDA: the children
    set their GPU and all-reduce on it. Expected: every rank returns the world size; before
    the fix the parent's torch.cuda.is_available() made the children fail in set_device."""
    import ringtrain as rt

    out = rt.launch(_fork_rank, nprocs, start_method="fork", timeout=300)
    assert [r["sum"] for r in out] == [float(nprocs)] * nprocs, out
    assert all(r["device"].startswith("cuda") for r in out), out
    assert not torch.cuda.is_initialized(), "the parent initialized CUDA"
    print("ok:", out)


if __name__ == "__main__":
    command, argument = sys.argv[1], sys.argv[2]
    if command == "save-load-step":
        save_load_step(argument)
    elif command == "fork-launch":
        fork_launch(int(argument))
    else:
        raise SystemExit(f"unknown step {command!r}")
