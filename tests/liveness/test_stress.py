"""Soak runs for the exit and teardown paths (``make test-stress``; minutes each, not in ``make test``).

* 200 save/close cycles on 2 ranks with a CPU hog beside them: every ``ring.close()`` destroys
  a Gloo group (the teardown whose ~ProcessGroupGloo once deadlocked on the GIL); 0 hangs,
  0 failures. Each cycle forms a new group in the same processes.
* 200 finished jobs under ``ringtrain run`` with a CPU hog beside them — a plain Gloo DDP
  script that trains, saves and calls ``dist.destroy_process_group()``, and a Ring script —
  exit 0 every time: no SIGABRT ("terminate called without an active exception") at
  interpreter exit (before the worker entry left without finalization: 3 of 20 under a hog).

``RINGTRAIN_STRESS_CYCLES`` / ``RINGTRAIN_STRESS_RUNS`` scale them (default 200).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import _stress_jobs as jobs  # noqa: E402
from _launch_util import child_env, ringtrain_cmd  # noqa: E402

import ringtrain as rt

pytestmark = pytest.mark.stress
CYCLES = int(os.environ.get("RINGTRAIN_STRESS_CYCLES", "200"))
RUNS = int(os.environ.get("RINGTRAIN_STRESS_RUNS", "200"))


class CpuHog:
    """Busy loops on every core, so the engine's threads are descheduled at awkward moments."""

    def __enter__(self) -> "CpuHog":
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(7200)
def test_save_close_cycles_under_cpu_load_never_hang(tmp_path):
    batch = 25
    done, started = 0, time.monotonic()
    with CpuHog():
        while done < CYCLES:
            n = min(batch, CYCLES - done)
            # Every cycle bounded: a hang would end the launch at its timeout and fail the test.
            results = rt.launch(jobs.save_close_cycles, 2, args=(str(tmp_path), n, done), timeout=60 + 10 * n)
            assert results[0] == results[1] == list(range(done, done + n))
            done += n
    print(f"\n{CYCLES} save/close cycles on 2 ranks under CPU load in {time.monotonic() - started:.0f} s: 0 hangs")


@pytest.mark.timeout(14400)
@pytest.mark.parametrize("script", ["plain", "ring"])
def test_finished_jobs_exit_cleanly_every_time(tmp_path, script):
    path = Path(jobs.__file__)
    failures: list = []
    started = time.monotonic()
    with CpuHog():
        outcomes = _finished_runs(path, script, tmp_path, failures)
    print(f"\n{RUNS} finished {script} jobs under ringtrain run (CPU hog beside them) in "
          f"{time.monotonic() - started:.0f} s: exit codes {dict(outcomes)}")
    assert outcomes == {0: RUNS}, "\n---\n".join(failures)


def _finished_runs(path: Path, script: str, tmp_path: Path, failures: list) -> collections.Counter:
    outcomes: collections.Counter = collections.Counter()
    for i in range(RUNS):
        proc = subprocess.run(ringtrain_cmd("run", "--nproc-per-node", "2", str(path), script, str(tmp_path / f"{i}.pt")),
                              capture_output=True, text=True, timeout=300, env=child_env())
        outcomes[proc.returncode] += 1
        if proc.returncode != 0 and len(failures) < 3:
            failures.append(proc.stderr[-3000:])
    return outcomes
