"""Turn torchelastic's ``ChildFailedError`` into the one report a person needs.

When a worker dies the agent stops every other worker on the node and raises
``ChildFailedError``, whose ``failures`` map global rank -> ``ProcessFailure``
(local rank, pid, exit code, error file). ``get_first_failure()`` picks the root cause
by the timestamp in the error file, as torchrun's own summary does. The others mostly
died *because* of the first (a peer vanished mid-collective), so the report leads with
the first one and its traceback and only lists the rest.
"""

from __future__ import annotations

import os
import re
import signal
import socket
from typing import Any

# Frames of the machinery between the agent and the user's code: ringtrain's worker entry,
# runpy, and torchelastic's @record wrapper. The report shows the user's frames only.
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
_MACHINERY = re.compile(
    r'^  File "(?:' + re.escape(_WORKER) + r'|<frozen runpy>|[^"]*[/\\]runpy\.py'
    r'|[^"]*torch[/\\]distributed[/\\]elastic[/\\]multiprocessing[/\\]errors[/\\]__init__\.py)", line \d+'
)

HINTS = {
    "signal": "a worker killed by a signal was often out of memory (check `dmesg` for the OOM "
    "killer) or crashed in native code; the faulthandler dump above, if any, shows where.",
    "exit": "the failing rank's own output above (its stderr) says why it exited; "
    "re-run with --nproc-per-node 1 to debug it as a plain script.",
    "exception": "fix the exception above; every other rank was stopped because of it.",
}


def _traceback(failure: Any) -> str | None:
    # ProcessFailure.message is a dict when the worker's `record` wrote the error file
    # ({"message": "...", "extraInfo": {"py_callstack": "..."}}), a str otherwise.
    message = failure.message
    if isinstance(message, dict):
        return message.get("extraInfo", {}).get("py_callstack") or message.get("message")
    return None


def user_frames(traceback: str) -> str:
    """Drop the launcher's own frames (each a `  File` line and its indented source lines)."""
    kept: list[str] = []
    skipping = False
    for line in traceback.splitlines():
        if line.startswith('  File "'):
            skipping = bool(_MACHINERY.match(line))
        elif not line.startswith("    "):
            skipping = False  # "Traceback (most recent call last):", the exception line, chained causes
        if not skipping:
            kept.append(line)
    return "\n".join(kept)


def describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"killed by signal {-exitcode} ({signal.Signals(-exitcode).name})"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def format_child_failure(error: Any, node_rank: int) -> str:
    """The report for a ``ChildFailedError`` raised by this node's agent."""
    rank, failure = error.get_first_failure()
    host = socket.gethostname()  # failures are always this node's: one agent per node
    lines = [
        f"ringtrain run: worker rank {rank} failed first "
        f"(local rank {failure.local_rank} on node {node_rank}, host {host}, pid {failure.pid}, "
        f"{describe_exit(failure.exitcode)}); all workers on this node were stopped.",
    ]
    traceback = _traceback(failure)
    if traceback:
        lines += ["", f"Traceback from rank {rank}:", user_frames(traceback).rstrip()]
        hint = HINTS["exception"]
    elif failure.exitcode < 0:
        hint = HINTS["signal"]
    else:
        lines += ["", f"rank {rank} left no Python traceback (it called sys.exit, or its "
                  "exception was raised before ringtrain's worker entry point ran)."]
        hint = HINTS["exit"]
    others = sorted(r for r in error.failures if r != rank)
    if others:
        lines += ["", "Other ranks that ended abnormally (usually stopped by the launcher after the first "
                  "failure, or failing because of it): " + ", ".join(
            f"rank {r} ({describe_exit(error.failures[r].exitcode)})" for r in others)]
    lines += ["", f"HINT: {hint}"]
    return "\n".join(lines)
