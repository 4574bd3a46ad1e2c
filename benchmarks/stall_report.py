"""From a rank getting stuck to the stall report, and to the end of the job: per case, measured.

    python benchmarks/stall_report.py                       # the default stall_warning (60 s), every case
    python benchmarks/stall_report.py --timeout 40          # Ring(timeout=40): when the job ends, who is blamed
    python benchmarks/stall_report.py --warning 10 --cases data,spin

Each case is ``ringtrain run --nproc-per-node 2 tests/helpers/_stall_jobs.py CASE`` (rank 1 stops at step 3:
``data`` its data step never ends, ``spin`` a Python loop, ``sigstop`` frozen, ``plain`` a plain torch
script sleeping before an all_reduce; ``extra`` rank 0 calls one all_reduce rank 1 never calls). Times
are from the job's own "JOB fault" line to the first stall report line (``ringtrain: stall:``), and to
the launcher's exit; "named" is whether the report (or the final report) names rank 1 at the right line.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = os.path.join(HERE, "..", "tests", "helpers", "_stall_jobs.py")
CASES = ("data", "spin", "sigstop", "plain", "extra")


def run(case: str, warning: float | None, timeout: float | None, limit: float) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if warning is not None:
        env["RINGTRAIN_STALL_WARNING"] = str(warning)
    args = [sys.executable, "-m", "ringtrain", "run", "--nproc-per-node", "2", JOBS, case]
    if timeout and case != "plain":
        args += ["--timeout", str(timeout)]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append((time.time(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        text = "".join(line for _, line in lines)
        if timeout is None and "ringtrain: stall:" in text and re.search(r"^  (not arrived|not responding)", text, re.M):
            break
        time.sleep(0.2)
    ended = proc.poll() is not None
    if not ended:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    reader.join(10)
    text = "".join(line for _, line in lines)
    fault = re.search(r"JOB fault rank=\d+ mode=\w+ t=([\d.]+)", text)
    start = float(fault.group(1)) if fault else None
    report = next((t for t, line in lines if line.startswith("ringtrain: stall:")), None)
    end = lines[-1][0] if ended and lines else None
    named = bool(re.search(r"rank 1 (was stuck|was not responding|in its|outside)|not responding: rank 1|"
                           r"not arrived:   rank 1|Where the ranks were last seen", text))
    return {"case": case, "report_s": report - start if report and start else None,
            "end_s": end - start if end and start else None, "named": named, "exit": proc.returncode,
            "lead": next((line.strip() for _, line in lines if line.startswith("ringtrain run:")), "")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warning", type=float, default=None, help="RINGTRAIN_STALL_WARNING (default: Ring's 60 s)")
    parser.add_argument("--timeout", type=float, default=None, help="Ring(timeout=...) in the job")
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    limit = (args.timeout or 0) + (args.warning or 60) + 60
    print("| case | stall → report (s) | stall → job ends (s) | rank 1 named | the launcher's first line |")
    print("|---|---|---|---|---|")
    for case in args.cases.split(","):
        got = run(case, args.warning, args.timeout, limit)
        report = f"{got['report_s']:.1f}" if got["report_s"] is not None else "—"
        end = f"{got['end_s']:.1f}" if got["end_s"] is not None else "— (stopped by the benchmark)"
        print(f"| {case} | {report} | {end} | {'yes' if got['named'] else 'no'} | {got['lead'][:140]} |", flush=True)


if __name__ == "__main__":
    main()
