"""Time from one rank's failure to the job's exit, for each way a rank leaves and each launcher.

    python benchmarks/failfast.py                    # the cases below, median of 5 each
    python benchmarks/failfast.py --repeat 1 --cap 90 --src /path/to/old/checkout/src

Each run is tests/helpers/_failfast_jobs.py: rank 1 leaves at step 3 (the case's way), rank 0 keeps
training. The time is from rank 1's fault (the time it prints) to the exit of the last
process of the job. ``--src`` measures another checkout of ringtrain (e.g. the commit before
fail-fast) with this interpreter; ``--cap`` kills a run that has not ended by then and
records it as "> cap". Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
import _failfast_runner as runner  # noqa: E402

CASES = [
    ("ringtrain-run", "ring", "raise"),
    ("ringtrain-run", "ring", "exit3"),
    ("ringtrain-run", "ring", "memory"),
    ("ringtrain-run", "ring", "before-setup"),
    ("ringtrain-run", "ring", "nan"),
    ("ringtrain-run", "ring", "return"),
    ("ringtrain-run", "ring", "close"),
    ("ringtrain-run", "ring", "kill"),
    ("ringtrain-run", "ring-hvd", "raise"),
    ("ringtrain-run", "hvd", "raise"),
    ("ringtrain-run", "hvd", "return"),
    ("ringtrain-run", "plain", "raise"),
    ("ringtrain-run", "plain", "return"),
    ("torchrun", "ring", "raise"),
    ("torchrun", "ring", "return"),
    ("launch", "ring", "raise"),
    ("launch", "ring", "return"),
    ("srun", "ring", "raise"),
    ("srun", "ring", "return"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cap", type=float, default=120.0,
                        help="seconds from the start after which a run is killed and counts as hung")
    parser.add_argument("--src", default=None, help="the src/ folder of the ringtrain to measure")
    parser.add_argument("--only", default=None, help="a substring of 'launcher api mode' to select cases")
    args = parser.parse_args()
    print("| launcher | API | rank 1 | exit | failure → exit (s), median | runs |")
    print("|---|---|---|---|---|---|")
    for launcher, api, mode in CASES:
        if args.only and args.only not in f"{launcher} {api} {mode}":
            continue
        times, codes = [], set()
        for _ in range(args.repeat):
            outcome = runner.run(launcher, api, mode, timeout=args.cap, src=args.src)
            codes.add(outcome.returncode)
            hung = outcome.timed_out or outcome.seconds is None or "NOT STOPPED" in outcome.output
            times.append(float("inf") if hung else outcome.seconds)
        median = statistics.median(times)
        shown = "hung (killed at the cap)" if median == float("inf") else f"{median:.1f}"
        runs = ", ".join("hung" if t == float("inf") else f"{t:.1f}" for t in times)
        print(f"| {launcher} | {api} | {mode} | {sorted(codes)} | {shown} | {runs} |", flush=True)


if __name__ == "__main__":
    main()
