"""What a rank leaves behind when it stops: one line, and the error file the launcher reads.

torchelastic's agent gives every worker a file (``TORCHELASTIC_ERROR_FILE``) and reads it
after a failure: the JSON that ``@record`` writes (``ErrorHandler.record_exception``, see
https://pytorch.org/docs/stable/elastic/errors.html). ringtrain writes the same layout,
with one addition under ``extraInfo["ringtrain"]`` that lets the launcher's report name
the rank that *caused* the failure rather than the first one to exit: the rank's ``Post``
(records.py) as a dict —

    {"time": 1732390000.123,          # time.time() when the rank stopped (sub-second)
     "cause": "own" | "peer",         # its own error, or stopped because of another rank
     "blame": {"rank": 1, "state": "finished" | "stuck" | ..., "reason": "process exit", "stack": ...} | null,
     "during": "all_reduce #7" | null, # the collective it was blocked in, when known
     "rank": 0, "state": "failed", "reason": "...", "pid": 123}

torchrun's own summary names as "Root Cause" the failure with the smallest ``timestamp``, in
whole seconds, ties going to the rank the agent saw exit first. A rank stopped because of a
peer (``cause: "peer"``) usually exits *before* the culprit, whose exit path (atexit handlers,
a data loader shutting down) takes longer, and within the same second: torchrun named the
stopped rank and listed the culprit as SIGTERMed. So the culprit writes its file as soon as it
fails (liveness/membership.py's excepthook), and a stop caused by a peer is stamped one second later than
its clock says: it is ordered after the failure that caused it (the exact time stays in
``extraInfo["ringtrain"]["time"]``, which ringtrain's own report reads).

Written atomically (a temporary file, then a rename): torch's own handler opens the file,
emptying it, before it writes, and the agent, which stops every other worker as soon as
one fails and then parses their files, died with ``JSONDecodeError`` on a file a stopped
worker had left empty.

A failed rank leaves no processes behind either. torchrun starts each worker in a session
of its own and, when a job fails, stops the workers *still running* with ``killpg``, which
takes along what they started (a data helper, a ``subprocess.Popen``). A worker that ended
by itself is skipped, so its children lived on, holding the launcher's stdout and stderr
(a caller reading them waited for the orphan: a CI job timed out that way) and often a GPU.
``stop_own_processes`` (a failing worker, on its way out) and ``stop_leftover_groups``
(the launcher, for workers killed by a signal) close that gap.

Torch-free on purpose: the launcher's worker entry uses it before (or without) torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

from . import procs

INFO_KEY = "ringtrain"


def write_error_file(path: str | None, message: str, callstack: str, info: dict[str, Any] | None = None) -> None:
    """Write torchelastic's error-file JSON to ``path`` (whole or not at all); no-op without a path."""
    if not path:
        return
    stamp = int(time.time()) + (1 if info and info.get("cause") == "peer" else 0)  # after its cause: see above
    extra: dict[str, Any] = {"py_callstack": callstack, "timestamp": str(stamp)}
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


def stop_own_processes(under_agent: bool) -> list[int]:
    """A failing torchrun worker: SIGTERM the processes it started (its process group), not itself.

    Only a worker that torchrun's agent started (``under_agent``: ``TORCHELASTIC_RUN_ID`` set, as the launcher
    contract's settings say, read by the caller) and that leads
    its own process group: ``python train.py`` typed in a shell also leads a group (job
    control), and there the group holds the user's ``| tee log`` too. The members are found
    in ``/proc`` (Linux) and signalled one by one, so this works from any thread (the
    liveness watchdog stops a rank from its own thread) and never signals this process.
    Returns the pids signalled.
    """
    me = os.getpid()
    if not under_agent or not hasattr(os, "getpgrp") or os.getpgrp() != me:
        return []
    signalled = []
    for pid in _group_members(me):
        if pid != me:
            with contextlib.suppress(ProcessLookupError):  # already gone
                os.kill(pid, signal.SIGTERM)
                signalled.append(pid)
    return signalled


def _group_members(pgid: int) -> list[int]:
    """The pids whose process group is ``pgid``, read from /proc (empty where there is no /proc)."""
    try:
        entries = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    return [pid for pid in entries if (fields := procs.stat(pid)) is not None and int(fields[2]) == pgid]


def stop_leftover_groups(pids) -> list[int]:
    """SIGKILL the process groups whose leader (a dead worker, ``pid``) is gone but members live on.

    A pid is not given to a new process while a process group of that number exists, so a
    group found under the number of a process that no longer exists is the dead worker's.
    A live leader is left to the agent's own stop (``killpg`` while it runs).
    Returns the group ids that were signalled.
    """
    stopped = []
    for pid in pids:
        if not pid or pid <= 0 or not hasattr(os, "killpg") or procs.exists(pid):
            continue
        with contextlib.suppress(ProcessLookupError):  # no such group: nothing was left behind
            os.killpg(pid, signal.SIGKILL)
            stopped.append(pid)
    return stopped
