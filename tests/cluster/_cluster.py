"""What tests/cluster/ shares (its conftest.py has the fixtures): where the examples are, the jobs' environment,
the session's Slurm cluster as an object, and the comparisons every job is held to."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import torch
from _launch_util import child_env

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "cluster"
TRAIN = EXAMPLES / "train.py"
CLUSTER_SCRIPT = REPO / "scripts" / "one_node_slurm.sh"
BASH = shutil.which("bash") or "/bin/bash"
EPOCHS = 2  # 128 optimizer steps of the global batch 32: train.py's defaults otherwise
TOLERANCE = 2e-6  # 2 processes against 1 after 128 steps: 1.8e-7 measured (docs/benchmarks.md)

# A launcher's variables the test process may have (a test run inside a Slurm job, under torchrun): never the jobs'.
_FOREIGN = re.compile(r"^(SLURM_|OMPI_|PMI_|PMIX_|PET_|TORCHELASTIC_|HOROVOD_|RINGTRAIN_PREEMPT)|^(RANK|LOCAL_RANK|WORLD_SIZE|"
                      r"LOCAL_WORLD_SIZE|GROUP_RANK|MASTER_ADDR|MASTER_PORT)$")


def job_env(bin_dir: Path, **extra: str) -> dict[str, str]:
    """child_env() less another launcher's variables, with ``python``/``ringtrain`` first on PATH (``bin_dir``)."""
    env = {k: v for k, v in child_env().items() if not _FOREIGN.match(k)}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def final_parameters(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "final.pt")["model"]


def assert_close_to(params: dict, reference: dict, tolerance: float = TOLERANCE) -> float:
    assert params.keys() == reference.keys()
    worst = max((params[k] - reference[k]).abs().max().item() for k in reference)
    assert worst <= tolerance, f"largest parameter difference {worst:.3g} > {tolerance:g}"
    return worst


def assert_bitwise(params: dict, reference: dict) -> None:
    assert params.keys() == reference.keys()
    differ = [k for k in reference if not torch.equal(params[k], reference[k])]
    assert not differ, f"parameters {differ} differ from the uninterrupted run's"


def outputs(proc: subprocess.CompletedProcess) -> str:
    return f"--- exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"


def stop_politely(procs: list[subprocess.Popen], grace: float = 15) -> None:
    """SIGTERM to those still running (mpirun and ``ringtrain run`` pass it on to their ranks: none is orphaned, as
    SIGKILL would leave them), SIGKILL ``grace`` seconds later."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.terminate()
    deadline = time.monotonic() + grace
    for p in running:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_together(argvs: list[list[str]], envs: list[dict], timeout: float) -> list[subprocess.CompletedProcess]:
    """Start every command (cwd: the repository), wait for all up to ``timeout`` seconds in all, and stop politely
    whatever is still running then (the test fails with what each wrote)."""
    procs = [subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv, env in zip(argvs, envs)]
    results = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    except subprocess.TimeoutExpired:
        stop_politely(procs)
        raise AssertionError(f"still running after {timeout} s (stopped): {[p.args for p in procs]}") from None
    finally:
        stop_politely(procs)
    return results


class Slurm:
    """The session's cluster: its slurm.conf, and what the tests ask of it (every call with a timeout)."""

    def __init__(self, folder: Path, bin_dir: Path):
        self.folder, self.bin_dir = folder, bin_dir
        self.conf = folder / "slurm.conf"
        self.nodes = int(self.ask("sinfo", "-h", "-o", "%D").stdout.split()[0])

    def env(self, **extra: str) -> dict[str, str]:
        return job_env(self.bin_dir, SLURM_CONF=str(self.conf), **extra)

    def run(self, *argv: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), cwd=REPO, env=env or self.env(), capture_output=True, text=True,
                              timeout=timeout)

    def ask(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env={**os.environ, "SLURM_CONF": str(self.conf)}, capture_output=True,
                              text=True, timeout=30)

    def sbatch(self, script: str, *args: str, output: Path, options: tuple = (), env: dict | None = None) -> int:
        """Submit ``examples/cluster/<script>`` from the repository's root (as its comment says), without waiting."""
        proc = self.run("sbatch", "--parsable", f"--output={output}", *options, f"examples/cluster/{script}", *args,
                        timeout=30, env=env)
        assert proc.returncode == 0, outputs(proc)
        return int(proc.stdout.strip().split(";")[0])

    def sbatch_wrap(self, *options: str, output: Path, env: dict | None = None) -> int:
        """``sbatch OPTIONS --wrap COMMAND`` (the last option), from the repository's root, without waiting."""
        *flags, command = options
        proc = self.run("sbatch", "--parsable", f"--output={output}", *flags, "--wrap", command, timeout=30, env=env)
        assert proc.returncode == 0, outputs(proc)
        return int(proc.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s fields (MinJobAge keeps a finished job there for 10 minutes)."""
        text = self.ask("scontrol", "show", "job", str(job_id)).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, job_id: int, until, timeout: float, poll: float = 0.1) -> dict[str, str]:
        """Ask until ``until(fields)``; the job's fields then."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if until(fields):
                return fields
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {fields.get('JobState')} after {timeout} s: {fields}")
            time.sleep(poll)

    def finished(self, job_id: int, timeout: float = 300) -> dict[str, str]:
        return self.wait(job_id, lambda f: f.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                                 "NODE_FAIL", "OUT_OF_MEMORY"), timeout, poll=0.2)


def slurm_missing() -> str | None:
    """Why no cluster can be started here (scripts/one_node_slurm.sh check), or None."""
    proc = subprocess.run([BASH, str(CLUSTER_SCRIPT), "check"], capture_output=True, text=True, timeout=30)
    return None if proc.returncode == 0 else (proc.stdout or proc.stderr).strip()
