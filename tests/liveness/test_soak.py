"""Issue 31's soaks (``make test-stress``; tens of minutes on 2 cores, recorded in docs/benchmarks.md): healthy jobs
on a busy machine get no false alarm. Busy loops beside every job (``BUSY`` of them, 3 by default); each run bounded.

* 8 ranks x 200 steps, 20 runs: every run exits 0, no rank blamed for finishing (issue 31, item 2);
* a 16-rank FSDP job and an 8-rank job with ``stall_warning=2``, 10 runs each: no stall report (item 3);
* one rank 3 s slower per step for 30 steps (90 s, over the default 60 s stall warning): never reported as
  stalled, and named by the slow-rank line.

``RINGTRAIN_SOAK_RUNS`` scales the run counts (a fraction: 0.1 runs a tenth).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

import pytest
from _launch_util import HELPERS, child_env, outputs, ringtrain_cmd

pytestmark = pytest.mark.stress
JOB = os.path.join(HELPERS, "_soak_jobs.py")
BUSY = int(os.environ.get("RINGTRAIN_SOAK_BUSY", "3"))
SCALE = float(os.environ.get("RINGTRAIN_SOAK_RUNS", "1"))
FALSE_ALARMS = re.compile(r"stall: no progress|could not go on without it|were in different collectives|"
                          r"failed first|Traceback")


class Busy:
    """``n`` busy loops beside the job, and the load average seen while they ran."""

    def __init__(self, n: int = BUSY):
        self.n, self.loads = n, []

    def __enter__(self) -> "Busy":
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        return self

    def sample(self) -> None:
        self.loads.append(os.getloadavg()[0])

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def _runs(n: int) -> int:
    return max(1, round(n * SCALE))


def _job(nproc: int, *args: str, warning: float | None = None,
         timeout: float = 900) -> tuple[subprocess.CompletedProcess, float]:
    env = child_env(**({"RINGTRAIN_STALL_WARNING": str(warning)} if warning is not None else {}))
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as here:  # ring.log's run folder goes there
        proc = subprocess.run(ringtrain_cmd("run", "--nproc-per-node", str(nproc), JOB, *args), capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=here)
    return proc, time.monotonic() - started


def _soak(name: str, runs: int, nproc: int, *args: str, warning: float | None = None) -> list[str]:
    """``runs`` healthy jobs beside busy loops; the runs that failed or raised a false alarm, with their output."""
    bad, took = [], []
    with Busy() as busy:
        for i in range(runs):
            proc, seconds = _job(nproc, *args, warning=warning)
            busy.sample()
            took.append(seconds)
            said = proc.stdout + proc.stderr
            done = len(re.findall(r"^JOB done rank=\d+ steps=\d+$", proc.stdout, re.M))
            if proc.returncode != 0 or done != nproc or FALSE_ALARMS.search(said):
                bad.append(f"--- run {i}: exit {proc.returncode}, {done} of {nproc} done\n" + outputs(proc)[-4000:])
    print(f"\n{name}: {runs} runs beside {BUSY} busy loops, {len(bad)} false alarm(s); "
          f"{min(took):.0f}-{max(took):.0f} s a run; load average {min(busy.loads):.1f}-{max(busy.loads):.1f}")
    return bad


@pytest.mark.timeout(14400)
def test_eight_ranks_two_hundred_steps_never_fail_at_the_end():
    bad = _soak("8 ranks x 200 steps", _runs(20), 8, "--steps", "200")
    assert not bad, "\n".join(bad)


@pytest.mark.timeout(14400)
def test_sixteen_rank_fsdp_gets_no_stall_report():
    bad = _soak("16-rank FSDP x 100 steps, stall_warning 10 s", _runs(10), 16, "--strategy", "fsdp", "--steps", "100",
                warning=10)
    assert not bad, "\n".join(bad)


@pytest.mark.timeout(14400)
def test_eight_ranks_with_a_two_second_stall_warning_get_no_stall_report():
    bad = _soak("8 ranks x 200 steps, stall_warning 2 s", _runs(10), 8, "--steps", "200", warning=2)
    assert not bad, "\n".join(bad)


@pytest.mark.timeout(1800)
def test_a_rank_three_seconds_slower_a_step_is_named_slow_never_stalled():
    with Busy() as busy:
        proc, seconds = _job(2, "--steps", "30", "--slow-rank", "1", "--slow-s", "3")
        busy.sample()
    said = proc.stdout + proc.stderr
    print(f"\nslow rank: 30 steps at +3 s in {seconds:.0f} s beside {BUSY} busy loops (load {busy.loads[0]:.1f})")
    assert proc.returncode == 0 and not FALSE_ALARMS.search(said), outputs(proc)
    assert re.search(r"ringtrain: rank 1 is the slowest", said), outputs(proc)
