"""Horovod's own PyTorch test suite, run against ``ringtrain.horovod`` (issue 11).

    python benchmarks/horovod_conformance.py /path/to/horovod              # 2 and 3 ranks
    python benchmarks/horovod_conformance.py /path/to/horovod --np 2 --exclude-muon
    python benchmarks/horovod_conformance.py /path/to/horovod --np 2 -k join --json out.json

The argument is a Horovod source checkout (github.com/horovod/horovod at v0.28.1) or a
folder holding the same three files at the same relative paths:

    test/parallel/test_torch.py    the suite itself (4,400 lines, 115 tests)
    test/utils/common.py           its helpers
    horovod/runner/util/threads.py ``in_thread``, which common.py imports

Horovod's files never enter this repository: they are copied into a temporary folder,
unchanged (``--exclude-muon`` edits the copy only: torch 2.13's Muon optimizer refuses
1-D parameters, so the three tests that build every ``torch.optim`` optimizer fail on
real Horovod too), and the whole file runs at once, as Horovod's CI runs it::

    ringtrain run --horovod -np N -m pytest test_torch.py

``horovod.torch`` then resolves to ringtrain's alias. ``horovod.runner`` is Horovod's
launcher, which ringtrain does not imitate; the harness's one import from it
(``in_thread``, a ten-line thread helper) is served from the checkout's own file by a
``conftest.py`` written next to the copy. That conftest also records every test's
outcome on every rank (``rank<R>.jsonl``), from which the table below is printed:
one row per test, one column per rank, and the totals. A test passes when it passes on
every rank.

The run always ends: pytest-timeout ends a rank stuck in one test (``--test-timeout``,
then the launcher ends the job, since a rank left), and the whole job is killed after
``--total-timeout``; tests a rank never reached are listed as ``missing``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

FILES = {
    "test_torch": os.path.join("test", "parallel", "test_torch.py"),
    "common": os.path.join("test", "utils", "common.py"),
    "threads": os.path.join("horovod", "runner", "util", "threads.py"),
}

CONFTEST = '''
"""Written by ringtrain's benchmarks/horovod_conformance.py: serve in_thread, record outcomes."""
import importlib.util, json, os, sys, types

def _serve_threads():
    for name in ("horovod.runner", "horovod.runner.util"):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = []
            sys.modules[name] = module
    spec = importlib.util.spec_from_file_location("horovod.runner.util.threads", {threads!r})
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["horovod.runner.util.threads"] = module
    sys.modules["horovod.runner.util"].threads = module

_serve_threads()
_OUT = open(os.path.join({out!r}, "rank%s.jsonl" % os.environ.get("RANK", "0")), "a", buffering=1)

def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        detail = ""
        if report.outcome == "failed":
            detail = str(report.longrepr).strip().splitlines()[-1][:300] if report.longrepr else ""
        elif report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            detail = str(report.longrepr[2])[:200]
        _OUT.write(json.dumps({{"test": report.nodeid.split("::")[-1], "when": report.when,
                                "outcome": report.outcome, "detail": detail,
                                "seconds": round(report.duration, 3)}}) + "\\n")
'''

# The one place ``--exclude-muon`` edits the copy: the optimizer lists of
# test_broadcast_state, test_broadcast_state_options and test_force_allreduce.
MUON_FROM = "subclass != torch.optim.SparseAdam"
MUON_TO = "subclass != torch.optim.SparseAdam and subclass.__name__ != 'Muon'"


def locate(root: str) -> dict:
    paths = {key: os.path.join(root, rel) for key, rel in FILES.items()}
    missing = [rel for key, rel in FILES.items() if not os.path.isfile(paths[key])]
    if missing:
        sys.exit(f"error: {root} lacks {', '.join(missing)}\n"
                 "HINT: pass a Horovod source checkout (github.com/horovod/horovod, tag v0.28.1).")
    return paths


def prepare(paths: dict, workdir: str, out: str, exclude_muon: bool) -> str:
    parallel = os.path.join(workdir, "parallel")
    utils = os.path.join(workdir, "utils")
    os.makedirs(parallel)
    os.makedirs(utils)
    shutil.copy(paths["common"], utils)
    target = os.path.join(parallel, "test_torch.py")
    with open(paths["test_torch"], encoding="utf-8") as f:
        source = f.read()
    if exclude_muon:
        if source.count(MUON_FROM) != 3:
            sys.exit("error: --exclude-muon expected the 3 optimizer lists of Horovod v0.28.1's test_torch.py")
        source = source.replace(MUON_FROM, MUON_TO)
    with open(target, "w", encoding="utf-8") as f:
        f.write(source)
    threads = os.path.join(workdir, "horovod_threads.py")
    shutil.copy(paths["threads"], threads)
    with open(os.path.join(parallel, "conftest.py"), "w", encoding="utf-8") as f:
        f.write(CONFTEST.format(threads=threads, out=out))
    try:  # common.py imports the `mock` backport only for mock.patch, which unittest.mock has
        import mock  # noqa: F401
    except ImportError:
        with open(os.path.join(utils, "mock.py"), "w", encoding="utf-8") as f:
            f.write("from unittest.mock import *  # noqa: F401,F403  (shim written by horovod_conformance.py)\n")
    return parallel


def run(np: int, parallel: str, out: str, args) -> tuple[int, float, str]:
    command = [sys.executable, "-m", "ringtrain", "run", "--horovod", "-np", str(np), "-m", "pytest", "test_torch.py", "-q", "-p",
               "no:cacheprovider", f"--timeout={args.test_timeout}", "--timeout-method=thread"]
    if args.k:
        command += ["-k", args.k]
    log_path = os.path.join(out, "job.log")
    start = time.monotonic()
    with open(log_path, "w") as log:
        job = subprocess.Popen(command, cwd=parallel, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = job.wait(timeout=args.total_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
            rc = -9
    return rc, time.monotonic() - start, log_path


def outcomes(out: str, np: int) -> dict[int, dict[str, tuple[str, str]]]:
    per_rank: dict[int, dict[str, tuple[str, str]]] = {}
    for rank in range(np):
        got: dict[str, tuple[str, str]] = {}
        path = os.path.join(out, f"rank{rank}.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    row = json.loads(line)
                    if row["outcome"] == "failed" and row["when"] != "call" and got.get(row["test"], ("",))[0] == "failed":
                        continue
                    if row["outcome"] == "failed" and row["when"] == "teardown":
                        row["outcome"], row["detail"] = "error", "teardown: " + row["detail"]
                    if row["test"] in got and row["when"] == "teardown" and row["outcome"] == "passed":
                        continue
                    got[row["test"]] = (row["outcome"], row["detail"])
        per_rank[rank] = got
    return per_rank


def collected(parallel: str, args) -> list[str]:
    """Test names in file order (collection needs no process group)."""
    command = [sys.executable, "-m", "pytest", "test_torch.py", "--collect-only", "-q", "-p", "no:cacheprovider"]
    if args.k:
        command += ["-k", args.k]
    env = dict(os.environ)
    import ringtrain.horovod  # noqa: F401  (the installed package's alias folder)
    alias = os.path.join(os.path.dirname(ringtrain.horovod.__file__), "_alias")
    env["PYTHONPATH"] = alias + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(command, cwd=parallel, env=env, capture_output=True, text=True, timeout=300)
    return [line.split("::")[-1] for line in result.stdout.splitlines() if "::" in line]


def verdict(cells: list[str]) -> str:
    if all(c == "passed" for c in cells):
        return "pass"
    if all(c == "skipped" for c in cells):
        return "skip"
    if "missing" in cells:
        return "missing"
    return "FAIL"


def report(np: int, names: list[str], per_rank: dict, rc: int, seconds: float, log_path: str, verbose: bool) -> dict:
    rows = []
    for name in names:
        cells = [per_rank[r].get(name, ("missing", ""))[0] for r in range(np)]
        details = [per_rank[r].get(name, ("", ""))[1] for r in range(np)]
        rows.append({"test": name, "ranks": cells, "verdict": verdict(cells), "details": details})
    totals = Counter(row["verdict"] for row in rows)
    runnable = len(rows) - totals["skip"]
    width = max((len(n) for n in names), default=10)
    print(f"\n== {np} ranks: {len(rows)} collected, {totals['skip']} skipped on every rank, {runnable} runnable; "
          f"{totals['pass']} pass on every rank, {totals['FAIL']} fail, {totals['missing']} missing "
          f"(job exit {rc}, {seconds:.0f} s)")
    header = f"{'test':<{width}}  " + "  ".join(f"rank {r:<3}" for r in range(np)) + "  verdict"
    print(header)
    for row in rows:
        if row["verdict"] in ("pass", "skip") and not verbose:
            continue
        print(f"{row['test']:<{width}}  " + "  ".join(f"{c:<8}" for c in row["ranks"]) + f"  {row['verdict']}")
        for r, detail in enumerate(row["details"]):
            if detail and row["verdict"] != "skip":
                print(f"{'':<{width}}    rank {r}: {detail}")
    if not verbose:
        print(f"({totals['pass']} passing and {totals['skip']} skipped tests not listed; --verbose lists them)")
    print(f"job log: {log_path}")
    return {"np": np, "exit": rc, "seconds": round(seconds, 1), "collected": len(rows), "skipped": totals["skip"],
            "runnable": runnable, "passed": totals["pass"], "failed": totals["FAIL"], "missing": totals["missing"],
            "tests": rows}


CELL = {"passed": "P", "failed": "F", "error": "E", "skipped": "s", "missing": "-"}


def markdown(results: list[dict]) -> str:
    """One row per test: the verdict and every rank's outcome (P pass, F fail, E error, s skip, - missing)."""
    head = "| test | " + " | ".join(f"{r['np']} ranks" for r in results) + " |\n"
    head += "|---|" + "---|" * len(results) + "\n"
    rows = []
    for i, row in enumerate(results[0]["tests"]):
        cells = []
        for r in results:
            t = r["tests"][i]
            cells.append(f"{t['verdict']} ({' '.join(CELL.get(c, '?') for c in t['ranks'])})")
        rows.append(f"| `{row['test']}` | " + " | ".join(cells) + " |")
    totals = "| **totals** | " + " | ".join(
        f"**{r['passed']} / {r['runnable']} pass** ({r['skipped']} skipped, {r['failed']} fail, {r['missing']} missing; "
        f"{r['seconds']:.0f} s, exit {r['exit']})" for r in results) + " |"
    return head + "\n".join(rows) + "\n" + totals + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("horovod", help="Horovod source checkout (v0.28.1), or a folder with the same three files")
    parser.add_argument("--np", default="2,3", help="rank counts to run, comma-separated (default 2,3)")
    parser.add_argument("--exclude-muon", action="store_true", help="leave torch.optim.Muon out of the copy's "
                        "optimizer lists (it refuses 1-D parameters on torch 2.13)")
    parser.add_argument("-k", default="", help="pytest -k expression (default: the whole file)")
    parser.add_argument("--test-timeout", type=int, default=240, help="seconds one test may take (default 240)")
    parser.add_argument("--total-timeout", type=int, default=2400, help="seconds one job may take (default 2400)")
    parser.add_argument("--json", help="write the outcomes here")
    parser.add_argument("--markdown", help="write a per-test table of every run here (for docs/benchmarks.md)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (its path is printed)")
    parser.add_argument("--verbose", action="store_true", help="list passing and skipped tests too")
    args = parser.parse_args(argv)

    paths = locate(os.path.abspath(args.horovod))
    results = []
    for np in [int(n) for n in args.np.split(",") if n]:
        workdir = tempfile.mkdtemp(prefix=f"hvd-conformance-np{np}-")
        out = os.path.join(workdir, "outcomes")
        os.makedirs(out)
        parallel = prepare(paths, workdir, out, args.exclude_muon)
        names = collected(parallel, args)
        rc, seconds, log_path = run(np, parallel, out, args)
        results.append(report(np, names, outcomes(out, np), rc, seconds, log_path, args.verbose))
        if args.keep:
            print(f"kept: {workdir}")
        else:
            kept_log = os.path.join(tempfile.gettempdir(), f"hvd-conformance-np{np}.log")
            shutil.copy(log_path, kept_log)
            print(f"job log kept as {kept_log}")
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"exclude_muon": args.exclude_muon, "runs": results}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(results))
    return 0 if all(r["failed"] == 0 and r["missing"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
