"""What a user pays to import the training object, after ``import torch``: ringtrain's ``Ring`` beside
Accelerate's ``Accelerator`` and Lightning Fabric's ``Fabric``.

Each sample is a fresh interpreter that imports torch, then times the second import alone (so torch's own
import, the same for all three, is not counted). It also says whether the import loaded
``torch.distributed.pipelining`` or ``torch._dynamo`` (a DDP user should not pay for the pipeline).

    python benchmarks/import_cost.py [--runs 7] [--python /path/to/python]

A library that is not installed in that interpreter is reported as such, not timed. Numbers are recorded in
docs/benchmarks.md ("What importing the Ring costs").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CANDIDATES = {
    "ringtrain.Ring": "import ringtrain as rt; rt.Ring",
    "accelerate.Accelerator": "from accelerate import Accelerator",
    "lightning.fabric.Fabric": "from lightning.fabric import Fabric",
}

PROBE = """
import sys, time
import torch
t0 = time.perf_counter()
{stmt}
dt = time.perf_counter() - t0
import json
print(json.dumps({{"s": dt, "pipelining": "torch.distributed.pipelining" in sys.modules,
                  "dynamo": "torch._dynamo" in sys.modules}}))
"""


def sample(python: str, stmt: str) -> dict | None:
    done = subprocess.run([python, "-c", PROBE.format(stmt=stmt)], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        if "ModuleNotFoundError" in done.stderr:
            return None
        raise SystemExit(f"{stmt!r} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    print(f"{'import (after torch)':26} {'median s':>9} {'min s':>7} {'max s':>7}  loads pipelining / dynamo")
    for name, stmt in CANDIDATES.items():
        first = sample(args.python, stmt)
        if first is None:
            print(f"{name:26} not installed in {args.python}")
            continue
        runs = [first] + [sample(args.python, stmt) for _ in range(args.runs - 1)]
        times = [r["s"] for r in runs]
        print(f"{name:26} {statistics.median(times):9.3f} {min(times):7.3f} {max(times):7.3f}  "
              f"{runs[0]['pipelining']} / {runs[0]['dynamo']}")


if __name__ == "__main__":
    main()
