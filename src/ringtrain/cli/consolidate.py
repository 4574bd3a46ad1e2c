"""ringtrain consolidate: turn a sharded checkpoint folder into one plain PyTorch file.

Usage:
    ringtrain consolidate DIR OUT.pt [--force]

DIR is a folder written by ``ring.save(path, ...)`` under FSDP (or ``full=False``), or a
periodic checkpoint of a ``checkpoint_dir`` (``step-000000120/``). One process reads every
rank's shards — no process group, no GPU, any world size it was written at — and writes OUT.pt
atomically: ``torch.load(OUT.pt)["model"]`` is a plain state dict under the model's own key
names, ``["optimizer"]`` what ``optimizer.state_dict()`` of the unsharded model gives, the other
entries as saved, and ``["ringtrain"]`` the run's state, so ``ring.load(OUT.pt)`` resumes from it too.

OUT.pt must be a new file outside DIR: a path inside the folder (or one of its files, through a link) is refused,
and an existing OUT.pt is replaced only with ``--force``, and only when it is a regular file (never a folder, a
device or a pipe). Either way nothing is written and DIR is untouched.

Memory: the whole model (and optimizer state) is held in this process's memory once.

Exit status: 0 written; 1 the folder is not a complete sharded checkpoint (a missing or
truncated shard file, no ringtrain.pt) or OUT cannot be written; 2 a usage error (DIR does not
exist, OUT is a folder, inside DIR, exists without --force or is not a regular file, or its folder is missing or
not writable: said before torch loads).
"""

from __future__ import annotations

import os
import sys

from ..errors import HintingParser, RingtrainError


def main(argv: list[str] | None = None) -> int:
    parser = HintingParser(prog="ringtrain consolidate", description=__doc__.split("\n\n", 1)[1],
                           formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
                           usage="ringtrain consolidate DIR OUT.pt [--force]")
    parser.add_argument("folder", metavar="DIR", help="a sharded checkpoint folder")
    parser.add_argument("out", metavar="OUT.pt", help="the plain file to write (a new file outside DIR)")
    parser.add_argument("--force", action="store_true", help="replace OUT.pt if it is a regular file already")
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
    refused = _refuse_output(args.folder, args.out, args.force)
    if refused:
        print(f"ringtrain consolidate: {refused}", file=sys.stderr)
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


def _refuse_output(folder: str, out: str, force: bool) -> str | None:
    """Why OUT.pt cannot be written (message and HINT), or None. The source is never written into nor replaced
    (``ringtrain consolidate DIR DIR/ringtrain.pt`` once destroyed the checkpoint it read and exited 0),
    and nothing but a regular file is ever replaced."""
    source = os.path.realpath(folder)
    target = os.path.realpath(out)
    inside = target == source or target.startswith(source.rstrip(os.sep) + os.sep)
    if not inside and os.path.lexists(out):
        try:
            inside = any(os.path.samefile(out, os.path.join(root, name))  # a hard link to one of its files
                         for root, _, names in os.walk(folder) for name in names)
        except OSError:
            pass
    if inside:
        return (f"OUT.pt {out!r} is inside the checkpoint folder {folder!r} (or one of its files): writing it would "
                "change the checkpoint being read; nothing was written\nHINT: write the file outside the folder, e.g. "
                f"{os.path.basename(source.rstrip(os.sep)) or 'checkpoint'}.pt beside it.")
    if not os.path.lexists(out):
        return None
    if os.path.islink(out) or not os.path.isfile(out):
        kind = "a link" if os.path.islink(out) else "not a regular file (a device, a pipe or a socket)"
        return (f"OUT.pt {out!r} exists and is {kind}: consolidate writes only regular files, and replaces nothing "
                "else; nothing was written\nHINT: give the path of a new file, e.g. consolidated.pt.")
    if not force:
        return (f"OUT.pt {out!r} exists; nothing was written\nHINT: give the path of a new file, or pass --force to "
                "replace that one.")
    return None
