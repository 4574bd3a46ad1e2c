"""NCCL's flight recorder, on for every ringtrain process group that uses NCCL.

torch's ProcessGroupNCCL can keep the last collectives of each rank in a ring buffer and, when one
times out, dump it to a file per rank (``TORCH_NCCL_TRACE_BUFFER_SIZE``, ``TORCH_NCCL_DUMP_ON_TIMEOUT``,
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``; https://pytorch.org/docs/stable/torch_nccl_debug.html), which
``python -m torch.distributed.flight_recorder.fr_trace DIR`` lines up across ranks to show the first
collective they disagree on. torch reads these settings only from the environment, before the group
forms; ``settings`` gives what to set there — never over a value the user set — and ``note`` the line a
stall report or a timeout adds to point at the dumps. Gloo has no recorder: nothing is set for it.
Torch-free; GPU paths stay unrun on CPU machines, so the decisions live here, tested without NCCL.
"""

from __future__ import annotations

import os
from typing import Mapping

TRACE_ENTRIES = 2000  # collectives kept per rank (torch's examples use 2000: a few KiB each)
_SIZE = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")
_FILE = ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")


def settings(backend: str, environ: Mapping[str, str], folder: str, job: str) -> dict[str, str]:
    """The variables to set for ``backend`` so that NCCL records and dumps on a timeout (none for Gloo)."""
    if "nccl" not in backend:
        return {}
    out: dict[str, str] = {}
    if not any(environ.get(k) for k in _SIZE):
        out["TORCH_NCCL_TRACE_BUFFER_SIZE"] = str(TRACE_ENTRIES)
    if "TORCH_NCCL_DUMP_ON_TIMEOUT" not in environ:
        out["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
    if not any(environ.get(k) for k in _FILE):
        # torch appends each rank's number to this prefix
        out["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = os.path.join(folder, f"ringtrain-nccl-trace-{job}-rank")
    return out


def note(backend: str, environ: Mapping[str, str]) -> str | None:
    """Where the dumps go, and how to read them; None when there is no recorder (Gloo, or turned off)."""
    if "nccl" not in backend:
        return None
    size = next((environ[k] for k in _SIZE if environ.get(k)), "0")
    if size in ("", "0") or environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT", "1") in ("0", ""):
        return None
    prefix = next((environ[k] for k in _FILE if environ.get(k)), "/tmp/nccl_trace_rank_")
    return (f"NCCL's flight recorder dumps each rank's last {size} collectives to {prefix}<rank> when a collective "
            f"times out: `python -m torch.distributed.flight_recorder.fr_trace {os.path.dirname(prefix) or '.'}` "
            "shows the first one the ranks disagree on.")
