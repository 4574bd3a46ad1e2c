"""What a rank leaves behind when it stops: one line, and the error file the launcher reads.

torchelastic's agent gives every worker a file (``TORCHELASTIC_ERROR_FILE``) and reads it
after a failure: the JSON that ``@record`` writes (``ErrorHandler.record_exception``, see
https://pytorch.org/docs/stable/elastic/errors.html). ringtrain writes the same layout,
with one addition under ``extraInfo["ringtrain"]`` that lets the launcher's report name
the rank that *caused* the failure rather than the first one to exit:

    {"time": 1732390000.123,          # time.time() when the rank stopped (sub-second)
     "cause": "own" | "peer",         # its own error, or stopped because of another rank
     "blame": {"rank": 1, "state": "finished", "reason": "process exit"} | null,
     "during": "all_reduce #7" | null} # the collective it was blocked in, when known

Written atomically (a temporary file, then a rename): torch's own handler opens the file,
emptying it, before it writes, and the agent, which stops every other worker as soon as
one fails and then parses their files, died with ``JSONDecodeError`` on a file a stopped
worker had left empty.

Torch-free on purpose: the launcher's worker entry uses it before (or without) torch.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

INFO_KEY = "ringtrain"


def write_error_file(path: str | None, message: str, callstack: str, info: dict[str, Any] | None = None) -> None:
    """Write torchelastic's error-file JSON to ``path`` (whole or not at all); no-op without a path."""
    if not path:
        return
    extra: dict[str, Any] = {"py_callstack": callstack, "timestamp": str(int(time.time()))}
    if info:
        extra[INFO_KEY] = info
    data = {"message": {"message": message, "extraInfo": extra}}
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError as error:
        print(f"ringtrain: could not write the error file {path}: {error}", file=sys.stderr)


def info_of(message: Any) -> dict[str, Any] | None:
    """The ``ringtrain`` entry of a parsed error file's ``message`` (a dict), if there is one."""
    if isinstance(message, dict):
        info = message.get("extraInfo", {}).get(INFO_KEY)
        return info if isinstance(info, dict) else None
    return None


def describe_blame(blame: dict[str, Any]) -> str:
    """``rank 1 finished (process exit)`` / ``rank 1 failed (ValueError: boom)``."""
    return f"rank {blame.get('rank')} {blame.get('state', 'left')} ({blame.get('reason', 'no reason given')})"
