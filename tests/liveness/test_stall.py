"""Stuck and slow ranks, end to end: real `ringtrain run` jobs where one rank stays alive but stops.

Each job is tests/_stall_jobs.py (rank 1 stops at step 3: in its data step, in a Python loop, frozen
with SIGSTOP...), with ``RINGTRAIN_STALL_WARNING`` short. The output is read as it comes; each test
waits for the line it expects (never longer than its bound), then ends the job. The watchdog's
parts (checks, reports) are unit-tested at the end with synthetic whereabouts.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

import _stall_jobs as jobs
import pytest

from _launch_util import child_env, ringtrain_cmd

from ringtrain.liveness import stall
from ringtrain.launcher import stacks as stacks_cli
from ringtrain.liveness.records import Whereabouts

pytestmark = pytest.mark.timeout(120)

WARNING_S = 3
STARTUP_S = 80  # launch to the fault: imports and 3 steps, bounded for a loaded machine
FAULT = r"JOB fault rank=\d+ mode=\w+ t=([\d.]+)"
JOBS = jobs.__file__
# rank 1's never-ending data step (time.sleep in __getitem__), as file:line
_LINE = next(i for i, text in enumerate(open(JOBS), 1) if "# the data step that never ends" in text)
SLEEP_LINE = f"_stall_jobs.py:{_LINE}"


class Job:
    """A `ringtrain run` job whose output is collected while it runs."""

    def __init__(self, *args: str, warning: float | None = WARNING_S):
        env = child_env(**({"RINGTRAIN_STALL_WARNING": str(warning)} if warning else {}))
        self.started = time.monotonic()
        self.proc = subprocess.Popen(ringtrain_cmd("run", "--nproc-per-node", "2", JOBS, *args), env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def _await(self, pattern: str, within: float) -> re.Match:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if found := re.search(pattern, self.text, re.M):
                return found
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r} within {within} s; the job said:\n{self.text[-6000:]}")

    def wait_for(self, pattern: str, within: float, start_within: float = STARTUP_S) -> float:
        """Seconds from the fault (the job's "JOB fault" line) to the first line matching ``pattern``.

        ``within`` counts from the fault, not from the launch: on a loaded machine two workers may take
        tens of seconds to import torch and reach step 3, which says nothing about the watchdog. A job with
        no fault (or a pattern seen first) is given ``start_within + within`` from the launch."""
        first = self._await(rf"{FAULT}|{pattern}", start_within + within)
        if re.search(pattern, self.text, re.M) or first.group(1) is None:
            self._await(pattern, 0.1)
            return 0.0
        at = float(first.group(1))
        self._await(pattern, max(1.0, within - (time.time() - at)))
        return time.time() - at

    def end(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the workers die with the launcher (PR_SET_PDEATHSIG)
        self.proc.wait(30)
        self._reader.join(10)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc) -> None:
        self.end()


def test_a_rank_stuck_in_its_data_step_is_named_with_its_line():
    with Job("data") as job:
        after = job.wait_for(r"^  not arrived:   rank 1 in its data step", WARNING_S + 15)
        assert after < WARNING_S + 10, job.text
        report = job.text[job.text.index("ringtrain: stall:"):]
        assert "rank 0 waits in backward (gradient all-reduce) of step 4" in report
        assert SLEEP_LINE in report and "time.sleep(10_000)" in report  # its line, and its stack
        assert "launcher/worker.py" not in report  # the launcher's own frames are left out
        assert report.count("ringtrain: stall:") == 1  # one report for the job, not one per rank


def test_a_rank_spinning_in_python_is_named_with_its_stack():
    with Job("spin") as job:
        job.wait_for(r"^  not arrived:   rank 1", WARNING_S + 15)
        report = job.text[job.text.index("ringtrain: stall:"):]
        assert "sum(range(1000))" in report


def test_a_frozen_rank_is_named_as_not_responding_with_its_process_state():
    with Job("sigstop") as job:
        job.wait_for(r"^  not responding: rank 1", WARNING_S + 15)
        line = next(line for line in job.text.splitlines() if line.startswith("  not responding: rank 1"))
        assert "stopped (SIGSTOP?)" in line and "pid " in line
        # Issue 37, item 7: the reporting rank (rank 0, waiting) is never listed as not responding: waiting for the
        # frozen rank's answer took longer than its own last word's freshness, in every SIGSTOP run (6 of 6).
        report = job.text[job.text.index("ringtrain: stall:"):]
        assert "not responding: rank 0" not in report, report
        assert "  waiting:       rank 0 in backward (gradient all-reduce)" in report, report


HOOK_LINE = next(i for i, text in enumerate(open(JOBS), 1) if "# the backward hook that never ends" in text)


def test_a_rank_stuck_in_its_own_backward_is_computing_not_waiting():
    """Issue 37, item 6: rank 1 sleeps in a backward hook of its own (it computes, it waits for nobody); rank 0
    waits for it in the gradient all-reduce. The report names rank 1 as not arrived, in its own backward computation,
    with the hook on its stack — not as a rank waiting in the gradient all-reduce."""
    with Job("hook") as job:
        job.wait_for(r"^  not arrived:   rank 1", WARNING_S + 15)
        report = job.text[job.text.index("ringtrain: stall:"):]
        assert "rank 0 waits in backward (gradient all-reduce) of step 4" in report, report
        line = next(line for line in report.splitlines() if line.startswith("  not arrived:   rank 1"))
        assert "in its own backward computation (step 4)" in line, report
        assert f"_stall_jobs.py:{HOOK_LINE} in stuck_in_backward" in line, report  # the hook's line
        assert "in stuck_in_backward" in report and "time.sleep(10_000)" in report, report  # its stack: the hook
        waiting = next((line for line in report.splitlines() if line.startswith("  waiting:")), "")
        assert "rank 1" not in waiting, report


def test_a_timeout_blames_the_rank_stuck_in_its_own_backward_not_the_one_that_waited():
    with Job("hook", "--timeout", "8", warning=None) as job:
        job.wait_for(r"^ringtrain run: rank 1 was stuck", 60)
        job.proc.wait(30)
        report = job.text[job.text.index("ringtrain run:"):]
        assert "failed first" not in report, report  # rank 0's timeout is the consequence
        assert "in its own backward computation" in report.splitlines()[0], report
        assert "Where rank 1 was:" in report and "stuck_in_backward" in report, report


def test_a_timeout_blames_the_stuck_rank_not_the_one_that_waited():
    with Job("data", "--timeout", "8", warning=None) as job:  # the default stall warning (60 s) never fires
        job.wait_for(r"^ringtrain run: rank 1 was stuck", 60)
        job.proc.wait(30)
        report = job.text[job.text.index("ringtrain run:"):]
        assert "in its data step" in report and SLEEP_LINE in report
        assert "failed first" not in report  # rank 0's timeout is the consequence
        assert "Where rank 1 was:" in report and "time.sleep(10_000)" in report
        assert job.proc.returncode != 0


def test_stacks_on_demand_from_every_rank_without_stopping_the_job():
    with Job("data", warning=None) as job:
        job.wait_for(r"JOB fault rank=0", 60)  # rank 1 is stuck fetching that step's batch
        time.sleep(1.0)
        done = subprocess.run(ringtrain_cmd("stacks", str(job.proc.pid)), capture_output=True, text=True,
                              timeout=30, env=child_env())
        assert done.returncode == 0, done.stderr
        job.wait_for(rf"^\[rank 1\]   File .*_stall_jobs.py\", line {_LINE}, in __getitem__", 20)
        job.wait_for(r"^\[rank 0\] Thread 'MainThread'", 20)
        assert job.proc.poll() is None  # still running


def test_a_slow_rank_that_moves_is_never_reported_as_stalled():
    """Issue 31, item 3: rank 1 takes 2 s more per step than rank 0 from step 3 on; rank 0 spends most of each
    step waiting in backward, but both move, step after step: no stall report with a 3 s warning (the stall
    clock counted samples of "in backward" and was never reset when the step advanced)."""
    with Job("slowstep", "--steps", "9", warning=WARNING_S) as job:
        job.wait_for(r"^JOB done rank=0 steps=9", 90)
        job.proc.wait(60)
        assert job.proc.returncode == 0, job.text
        assert "ringtrain: stall:" not in job.text, job.text


def test_a_rank_holding_the_gil_in_native_code_is_shown_where_it_is_now():
    """Issue 31, item 8: rank 1 is stuck in a native call that holds the GIL (its watchdog cannot answer and its
    published position goes stale); the report takes its stack from outside and shows that line."""
    line = next(i for i, text in enumerate(open(JOBS), 1) if "# the native call that holds the GIL" in text)
    with Job("native") as job:
        job.wait_for(r"^  not responding: rank 1", WARNING_S + 20)
        job.wait_for(rf"_stall_jobs\.py\", line {line}", 5)
        report = job.text[job.text.index("ringtrain: stall:"):]
        assert "(taken from outside: it did not answer)" in report, report


def test_the_slowest_rank_is_named_with_where_its_time_goes():
    with Job("slow", "--steps", "200", warning=None) as job:
        job.wait_for(r"^JOB stats", 90)
        job.proc.wait(60)
        text = job.text
    line = next(line for line in text.splitlines() if line.startswith("ringtrain: rank 1 is the slowest"))
    assert "data loading" in line and "the others wait" in line, line
    assert text.count("is the slowest") == 1  # once per epoch
    # ring.stats() and the launcher's end-of-job table say the same
    stats = eval(text.split("JOB stats ", 1)[1].splitlines()[0])  # noqa: S307 - our own job's repr of a dict
    assert stats[1]["data_pct"] > 50 and stats[0]["wait_pct"] > 50
    # rank 1's row: steps, ms/step, then its data % — most of its step (89.7 % seen under CI load)
    assert "ringtrain: per-rank step times" in text and re.search(r"^\s+1\s+\d+\s+[\d.]+\s+[5-9]\d\.\d", text, re.M)


def test_a_plain_torch_script_that_stalls_under_ringtrain_run_is_named():
    with Job("plain") as job:
        job.wait_for(r"^  not arrived:   rank 1", WARNING_S + 20)
        report = job.text[job.text.index("ringtrain: stall:"):]
        assert "rank 0 waits in all_reduce" in report and "time.sleep(10_000)" in report


def test_a_collective_one_rank_never_calls_is_reported_with_where_the_ranks_were():
    with Job("extra", warning=None) as job:
        job.wait_for(r"^HINT: native code aborted", 60)
        report = job.text[job.text.index("ringtrain run:"):]
        assert "killed by signal 6 (SIGABRT)" in report and "Where the ranks were last seen (" in report
        assert "out of memory" not in report
        extra = next(i for i, text in enumerate(open(JOBS), 1) if "# rank 1 never calls this one" in text)
        assert f"rank 0 aborted at tests/_stall_jobs.py:{extra} in ring_job" in report \
            or f"_stall_jobs.py:{extra} in ring_job; its stack at the crash" in report, report


# --- the parts --------------------------------------------------------------------------------------

def _view(rank: int, **fields) -> Whereabouts:
    return Whereabouts(rank=rank, pid=100 + rank, host="h", hostname="node", beat=fields.pop("beat", 1000.0), **fields)


def test_mismatched_collectives_are_named_without_debug_mode():
    views = {0: _view(0, waiting="all_reduce #8", waiting_since=900.0, seq=8, site="train.py:40 in main"),
             1: _view(1, waiting="backward (gradient all-reduce)", waiting_since=905.0, seq=7, step=11,
                      phase="backward", site="train.py:52 in main")}
    report = stall.stall_report(0, 2, views, {}, {}, 120, now=1000.0)
    assert ("the ranks are in different collectives: rank 0 is in all_reduce #8 at train.py:40 in main; "
            "rank 1 is in backward (gradient all-reduce) at train.py:52 in main") in report


def test_the_reporter_never_lists_itself_as_not_responding():
    # Its own last word on the board may be older than FRESH_S: it spent that time waiting for the others' answers.
    views = {0: _view(0, waiting="backward (gradient all-reduce)", waiting_since=900.0, phase="backward", beat=990.0),
             1: _view(1, phase="data", phase_since=900.0, beat=950.0)}
    report = stall.stall_report(0, 2, views, {}, {1: "stopped (SIGSTOP?)"}, 120, now=1000.0)
    assert "not responding: rank 0" not in report, report
    assert "  waiting:       rank 0 in backward (gradient all-reduce)" in report, report
    assert "  not responding: rank 1 (pid 101 on node: stopped (SIGSTOP?))" in report, report


def test_where_a_rank_is_says_only_what_is_known():
    # Issue 37, items 6 and 9: a rank computing inside its backward (its watchdog saw autograd on its stack and no
    # wait) is not "waiting"; a plain script's step is its own loop's, not a number ringtrain counted.
    assert _view(1, phase="backward", computing_backward=True).doing() == "in its own backward computation"
    assert _view(1, phase="backward").doing() == "in its backward step"  # between ring.backward and the step
    plain = _view(0, step=0, waiting="backward (gradient all-reduce)", waiting_since=990.0,
                  step_unknown="the script does not use the Ring")
    assert plain.step_said() == "step unknown: the script does not use the Ring"
    assert stall.place_of(plain, 1000.0) == "in backward (gradient all-reduce), for 10 s"
    assert _view(0, step=14).step_said() == "step 15"


def test_a_bottleneck_needs_its_peers_to_wait_a_fifth_of_their_step():
    def times(data, sync, step):
        return {"data": data, "sync": sync, "step": step, "steps": 20}

    slow = {0: _view(0, times=times(1, 45, 50)), 1: _view(1, times=times(41, 5, 50))}
    rank, line = stall.bottleneck(slow)
    assert rank == 1 and "data loading 41 ms/step" in line and "wait 40 ms/step" in line
    even = {0: _view(0, times=times(1, 9, 50)), 1: _view(1, times=times(2, 5, 50))}
    assert stall.bottleneck(even) is None  # 4 ms of 50: not worth a line


def test_ringtrain_stacks_finds_only_launchers():
    assert stacks_cli._is_launcher(["/usr/bin/python3", "/venv/bin/ringtrain", "run", "x.py"])
    assert stacks_cli._is_launcher(["ringtrain", "run", "--nproc-per-node", "2", "x.py"])
    assert stacks_cli._is_launcher(["python", "-m", "ringtrain", "run", "x.py"])
    assert not stacks_cli._is_launcher(["timeout", "40", "ringtrain", "run", "x.py"])
    assert not stacks_cli._is_launcher(["python", "-u", "/src/ringtrain/launcher/worker.py", "path", "none", "1", "x.py"])


def test_nccl_gets_the_flight_recorder_and_reports_point_at_its_dumps():
    from ringtrain.liveness import flight

    assert flight.settings("gloo", {}, "/tmp", "job") == {}
    nccl = flight.settings("cpu:gloo,cuda:nccl", {}, "/tmp", "job")
    assert nccl == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/tmp/ringtrain-nccl-trace-job-rank"}
    # what the user set stays
    assert flight.settings("nccl", {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"},
                           "/tmp", "job") == {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/tmp/ringtrain-nccl-trace-job-rank"}
    note = flight.note("nccl", nccl)
    assert "/tmp/ringtrain-nccl-trace-job-rank<rank>" in note and "fr_trace /tmp" in note
    assert flight.note("nccl", {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}) is None  # turned off by the user
    assert flight.note("gloo", nccl) is None
