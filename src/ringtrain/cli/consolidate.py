"""ringtrain consolidate: turn a sharded checkpoint folder into one plain PyTorch file.

Usage:
    ringtrain consolidate DIR OUT.pt

DIR is a folder written by ``ring.save(path, ...)`` under FSDP (or ``full=False``), or a
periodic checkpoint of a ``checkpoint_dir`` (``step-000000120/``). One process reads every
rank's shards — no process group, no GPU, any world size it was written at — and writes OUT.pt
atomically: ``torch.load(OUT.pt)["model"]`` is a plain state dict under the model's own key
names, ``["optimizer"]`` what ``optimizer.state_dict()`` of the unsharded model gives, the other
entries as saved, and ``["ringtrain"]`` the run's state, so ``ring.load(OUT.pt)`` resumes from it too.

Memory: the whole model (and optimizer state) is held in this process's memory once.

Exit status: 0 written; 1 the folder is not a complete sharded checkpoint (a missing or
truncated shard file, no ringtrain.pt) or OUT cannot be written; 2 a usage error (DIR does not
exist, OUT is a folder or its folder is missing or not writable: said before torch loads).
"""

from __future__ import annotations

import os
import sys

from ..errors import HintingParser, RingtrainError


def main(argv: list[str] | None = None) -> int:
    parser = HintingParser(prog="ringtrain consolidate", description=__doc__.split("\n\n", 1)[1],
                           formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
                           usage="ringtrain consolidate DIR OUT.pt")
    parser.add_argument("folder", metavar="DIR", help="a sharded checkpoint folder")
    parser.add_argument("out", metavar="OUT.pt", help="the plain file to write")
    args = parser.parse_args(argv)
    # The arguments are checked before torch loads (seconds on a loaded machine): a wrong path answers at once.
    if not os.path.isdir(args.folder) or os.path.islink(args.folder):
        print(f"ringtrain consolidate: {args.folder!r} is not a folder\nHINT: give the folder ring.save wrote under "
              "FSDP (a plain .pt checkpoint is already consolidated).", file=sys.stderr)
        return 2 if not os.path.exists(args.folder) else 1
    parent = os.path.dirname(os.path.abspath(args.out))
    if os.path.isdir(args.out) or not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        what = "is a folder" if os.path.isdir(args.out) else f"cannot be written: {parent!r} is not a folder you can write to"
        print(f"ringtrain consolidate: OUT.pt {args.out!r} {what}\nHINT: give the path of a new file in a folder that "
              "exists, e.g. consolidated.pt.", file=sys.stderr)
        return 2
    from ..checkpoint import sharded  # imports torch: only once the arguments are known to be good

    try:
        tree = sharded.consolidate(args.folder, args.out)
    except RingtrainError as e:
        print(f"ringtrain consolidate: {e}", file=sys.stderr)
        return 1
    entries = ", ".join(k for k in tree if k != "ringtrain")
    print(f"ringtrain consolidate: wrote {args.out} ({entries}; {os.path.getsize(args.out) / 2**20:.1f} MiB)")
    return 0
