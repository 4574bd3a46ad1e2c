"""``ringtrain plan``: will it fit, and which layout is fastest — from the training script, before the job starts.

    ringtrain plan [--nproc-per-node N] [--nnodes M] [--device h100|a100|...|TFLOPS] [--device-memory 80GiB]
                   [--out DIR] script.py [script args ...]

Runs the script once, as ``python script.py args`` would, in planning mode (planning/mode.py): ``ring.setup`` gets
the real model and optimizer, the model's first call the first batch; then every layout of N x M ranks (DDP, FSDP,
HSDP, TP, DDP x TP, FSDP x TP; activation checkpointing off / full / selective; FSDP's CPU offload) is traced for
one training step on fake tensors under a fake process group — nothing allocated, no process group, no device —
and the table is printed: the peak memory per rank by part, whether it fits, FLOPs, the predicted step time and
MFU, the fastest that fits marked with the line that runs it. The plan is written to DIR (default ``plan``):
``plan.json`` (schema in docs/plan.md), ``plan.txt``, ``plan.png``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from ..errors import HintingParser, RingtrainError
from ..parallel import contract


def parser() -> HintingParser:
    p = HintingParser(prog="ringtrain plan", description=__doc__.split("\n\n")[0],
                      epilog="docs/plan.md has the details: what is traced, the step-time model, the JSON schema.")
    p.add_argument("--nproc-per-node", type=int, default=1, help="ranks per node (default 1)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes (default 1)")
    p.add_argument("--device", default=None, help="h100 (default), h200, b200, a100, a100-40gb, l40s, a10g, l4, v100, "
                                                  "mi300x, cpu, or a peak in TFLOPS")
    p.add_argument("--device-memory", default=None, help="memory per device, e.g. 80GiB (default: the device's)")
    p.add_argument("--intra-gbps", type=float, default=None, help="GB/s a rank sends within a node (NVLink)")
    p.add_argument("--inter-gbps", type=float, default=None, help="GB/s a rank sends to other nodes (InfiniBand)")
    p.add_argument("--out", default="plan", help="the folder the plan is written to (default: plan)")
    p.add_argument("script", help="the training script (the one `ringtrain run` runs)")
    p.add_argument("args", nargs="...", help="the script's own arguments")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except RingtrainError as e:
        print(f"ringtrain plan: {e}", file=sys.stderr)
        return 2


def run(args) -> int:
    if args.nproc_per_node < 1 or args.nnodes < 1:
        raise RingtrainError(f"--nproc-per-node {args.nproc_per_node} --nnodes {args.nnodes}",
                             "give positive numbers of ranks per node and of nodes.")
    if not os.path.isfile(args.script):
        raise RingtrainError(f"the script {args.script!r} is not a file", "give the path of the training script.")
    from ..planning.mode import Request  # imports torch: after the arguments are checked (they are refused without it)

    folder = os.path.abspath(args.out)
    request = Request(folder, world_size=args.nproc_per_node * args.nnodes, nnodes=args.nnodes, device=args.device,
                      device_memory=args.device_memory, intra_gbps=args.intra_gbps, inter_gbps=args.inter_gbps)
    request.write()
    result = os.path.join(folder, "plan.json")
    started = time.time()
    env = {**os.environ, **contract.to_environ(plan=folder)}
    code = subprocess.run([sys.executable, args.script, *args.args], env=env).returncode
    planned = os.path.exists(result) and os.path.getmtime(result) >= started - 1
    if code != 0:
        return code
    if not planned:
        raise RingtrainError(f"{args.script} ended without a plan: it never reached ring.setup and its model's first "
                             "call", "the plan is made from the model, optimizer and batch a rt.Ring gets: the script "
                             "must call ring.setup(model, optimizer) and then run the model on a batch.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
