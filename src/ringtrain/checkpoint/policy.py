"""``Ring(resume=...)``: what the checkpoints already in a ``checkpoint_dir`` mean for a new run.

* ``"auto"`` (the default): resume from the newest checkpoint when it was written by a run with the
  same configuration (fingerprint.py: model structure, optimizer and its hyperparameters, global
  batch); otherwise refuse before anything is loaded, listing the differences. Another world size
  is not a difference: checkpoints load at any world size (resharded), and a global batch that
  changed with it (the same per-device batch on more or fewer devices) is said, not refused.
* ``"force"``: resume from it anyway, printing the differences.
* ``"never"``: start afresh. The manifest and every checkpoint in the folder are first moved into
  ``previous-<UTC time>/`` inside it — nothing is deleted, nothing of the old run can be resumed
  or rotated away by the new one's saves, and the message says where they went. A restart of the
  same job by its launcher (torchrun ``--max-restarts``) resumes from what this job wrote: "never"
  is about the runs before it, not about its own attempts.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Mapping

from ..errors import RingtrainError
from .folder import CheckpointDir

RESUME = ("auto", "force", "never")


def check_argument(resume: Any, folder: str | None) -> None:
    if resume not in RESUME or (resume != "auto" and folder is None):
        raise RingtrainError(f"Ring got resume={resume!r} with checkpoint_dir={folder!r}",
                             "resume= says what to do with the checkpoints already in a checkpoint_dir: 'auto' "
                             "(resume when the run's configuration is the same), 'force' or 'never'.")


def world_size_note(latest: str, saved: Mapping[str, Any], world_size: int) -> list[str]:
    if saved.get("world_size") in (None, world_size):
        return []
    return [f"ringtrain: {os.path.basename(latest)} was written by {saved['world_size']} processes, this run has "
            f"{world_size}: its state is loaded at the new size"]


def judge(resume: str, folder: str, latest: str, changed: list[str]) -> list[str]:
    """Refuse (``"auto"``) or announce (``"force"``) the differences between a checkpoint's run and this one."""
    if not changed:
        return []
    if resume == "auto":
        raise RingtrainError(
            f"checkpoint_dir {folder!r} holds {os.path.basename(latest)}, written by a run configured differently:"
            "\n  " + "\n  ".join(changed),
            "to continue from it under this configuration anyway, pass Ring(resume='force'); to start afresh, "
            "Ring(resume='never') (the folder's checkpoints are moved into a previous-* folder inside it, not "
            "deleted); or give this run a checkpoint_dir of its own.")
    return [f"ringtrain: resume='force': resuming from {os.path.basename(latest)} although the configuration "
            "changed:\n  " + "\n  ".join(changed)]


def set_aside(folder: CheckpointDir) -> str | None:
    """``"never"`` at a job's first attempt: move the folder's manifest and checkpoints into a new
    ``previous-<time>/`` inside it; what to say, or None when there was nothing."""
    names = folder.own_names()
    if not names:
        return None
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    aside, n = os.path.join(folder.folder, f"previous-{stamp}"), 1
    while os.path.lexists(aside):  # two fresh starts within a second
        aside, n = os.path.join(folder.folder, f"previous-{stamp}-{n}"), n + 1
    os.makedirs(aside)
    for name in names:
        os.rename(os.path.join(folder.folder, name), os.path.join(aside, name))
    return (f"ringtrain: resume='never': starting afresh; what was in {folder.folder} ({', '.join(names)}) was "
            f"moved to {aside}, nothing deleted")
