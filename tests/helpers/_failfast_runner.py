"""Run a _failfast_jobs.py job the way users start jobs, and measure how it ends.

Shared by tests/launcher/test_launch_failfast.py and benchmarks/failfast.py. Each run is
tagged with a unique marker in its command lines, so what is left running afterwards can
be found (``pgrep -f``) and killed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOBS = HERE / "_failfast_jobs.py"
from _launch_util import child_env, free_port  # noqa: E402

LAUNCHERS = ("ringtrain-run", "torchrun", "launch", "srun")


@dataclass
class Outcome:
    returncode: int
    seconds: float | None  # from rank 1's fault to the last process's exit; None: no fault seen
    output: str
    leftovers: str  # processes of this run still alive afterwards (then killed)
    timed_out: bool = False  # still running at the time limit: killed by the runner


def _command(launcher: str, api: str, mode: str, marker: str, src: str | None) -> list[str]:
    python = sys.executable
    if launcher == "ringtrain-run":
        flags = ["--horovod"] if api == "hvd" else []
        return [python, "-m", "ringtrain", "run", *flags, "--nproc-per-node", "2", str(JOBS), api, mode, marker]
    if launcher == "torchrun":
        return [python, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
                str(JOBS), api, mode, marker]
    if launcher == "launch":
        code = ("import sys, ringtrain as rt, _failfast_jobs as j\n"
                f"rt.launch(j.job, 2, args=({api!r}, {mode!r}))\n")
        return [python, "-c", code, marker]
    raise ValueError(launcher)


def run(launcher: str, api: str, mode: str, *, timeout: float = 150, src: str | None = None) -> Outcome:
    """Start the job, wait for every process to end (at most ``timeout`` s), and measure."""
    marker = f"ringtrain-failfast-{uuid.uuid4().hex[:12]}"
    env = child_env(str(HERE), *([src] if src else []))
    env["PYTHONUNBUFFERED"] = "1"
    started = time.time()
    if launcher == "srun":
        procs = _srun(api, mode, marker, env)
    else:
        procs = [subprocess.Popen(_command(launcher, api, mode, marker, src), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=env)]
    outputs, codes, timed_out = [], [], False
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, started + timeout - time.time()))
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            # Workers a plain torchrun started outlive their agent and hold its output pipe open.
            subprocess.run(["pkill", "-9", "-f", marker])
            out, _ = proc.communicate()
        outputs.append(out)
        codes.append(proc.returncode)
    ended = time.time()
    if launcher == "srun":
        outputs.extend(_srun_says(codes))
    output = "\n".join(outputs)
    leftovers = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout.strip()
    if leftovers:
        subprocess.run(["pkill", "-9", "-f", marker])
    fault = re.search(r"FAULT rank=1 t=([0-9.]+)", output)
    seconds = ended - float(fault.group(1)) if fault else None
    code = next((c for c in codes if c != 0), 0)
    return Outcome(code, seconds, output, leftovers, timed_out)


def _srun(api: str, mode: str, marker: str, env: dict) -> list[subprocess.Popen]:
    """Two tasks as ``srun -n 2`` starts them: Slurm's variables, no launcher agent, rank 0 hosts the store."""
    port = str(free_port())
    procs = []
    for rank in range(2):
        task = dict(env, SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NTASKS="2",
                    SLURM_NTASKS_PER_NODE="2", SLURM_NODEID="0", SLURM_JOB_ID="4242", SLURM_STEP_ID="0",
                    SLURM_STEP_NODELIST="127.0.0.1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, str(JOBS), api, mode, marker], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=task))
    return procs


def _srun_says(codes: list[int]) -> list[str]:
    """The lines srun itself prints for tasks that ended badly (``srun: error: HOST: task N: ...``)."""
    lines = []
    for task, code in enumerate(codes):
        if code > 0:
            lines.append(f"srun: error: localhost: task {task}: Exited with exit code {code}")
        elif code < 0:
            lines.append(f"srun: error: localhost: task {task}: {'Killed' if code == -9 else f'signal {-code}'}")
    return lines


def expected_text(mode: str) -> str:
    """What the output must say about rank 1's departure, whatever the launcher."""
    return {
        "raise": "rank one fails on purpose",
        "raise-slow-exit": "rank one fails on purpose",
        "exit3": "3",
        "memory": "MemoryError",
        "before-setup": "before ring.setup",
        "nan": "NaN",
        "return": "rank 1 finished",
        "close": "rank 1 finished (ring.close)",
        "kill": "SIGKILL",
    }[mode]
