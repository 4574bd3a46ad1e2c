"""The ``ringtrain`` command: one word picks the subcommand, which owns the rest of the line.

Each subcommand is a module with ``main(argv) -> int`` and its own parser and manual, so
``ringtrain run --help`` shows run's manual and nothing here needs to know its flags.
Modules are imported only when their subcommand is chosen: ``ringtrain --help`` must not
pay for importing torch.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from typing import NamedTuple


class Command(NamedTuple):
    module: str
    summary: str


COMMANDS: dict[str, Command] = {
    "run": Command("ringtrain.launcher.run", "start a training script on N processes per node, on one or many nodes"),
    "plan": Command("ringtrain.cli.plan", "will it fit: memory per rank and step time for every layout, from the script"),
    "env": Command("ringtrain.launcher.env_info", "print versions, devices, backends and launcher variables for a bug report"),
    "bench": Command("ringtrain.bench.cli", "measure every mode (single, dp, ddp, accumulate, hvd, pipeline, raw DDP) on this machine"),
    "doctor": Command("ringtrain.doctor.cli", "read a plain PyTorch distributed script and name the traps it falls into"),
    "stacks": Command("ringtrain.launcher.stacks", "make every rank of a running job print its Python stack (kill -USR1)"),
    "timeline": Command("ringtrain.tracking.timeline", "merge the per-rank parts of a --timeline folder into one trace and its picture"),
    "plot": Command("ringtrain.tracking.plot", "draw a run folder's logged curves (curves.png) and per-rank step times (ranks.png)"),
    "consolidate": Command("ringtrain.cli.consolidate", "turn a sharded checkpoint folder into one plain torch.save file"),
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ringtrain")
    except PackageNotFoundError:
        return "unknown (not installed)"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        "usage: ringtrain <command> [options ...]",
        "",
        "Distributed PyTorch training from an ordinary script.",
        "",
        "commands:",
        *(f"  {name.ljust(width)}  {cmd.summary}" for name, cmd in COMMANDS.items()),
        "",
        "`ringtrain <command> --help` shows a command's manual; `ringtrain --version` the version.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        print(usage(), file=sys.stderr)
        return 2
    name, rest = argv[0], argv[1:]
    if name in ("-h", "--help", "help"):
        print(usage())
        return 0
    if name in ("-V", "--version"):
        print(f"ringtrain {_version()}")
        return 0
    command = COMMANDS.get(name)
    if command is None:
        print(f"ringtrain: unknown command {name!r}\nHINT: use one of: {', '.join(COMMANDS)} "
              "(e.g. `ringtrain run --nproc-per-node 2 train.py`).", file=sys.stderr)
        return 2
    try:
        return importlib.import_module(command.module).main(rest)
    except KeyboardInterrupt:
        # Ctrl-C that no command took itself (ringtrain run's agent takes it once the job runs): during start-up,
        # torch still importing, it was 20 lines of traceback through the launcher's preflight checks.
        print(f"ringtrain {name}: interrupted (SIGINT)", file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # ended by SIGINT, as a shell expects of Ctrl-C (its loop stops too)
        return 130


if __name__ == "__main__":
    sys.exit(main())
