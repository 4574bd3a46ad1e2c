"""DCP's failures as ``RingtrainError``: what was being read or written, which rank, and the operating system's
errno and path. ``torch.distributed.checkpoint`` gathers every rank's failure into a ``CheckpointException`` — a
``BaseException``, which a script's ``except Exception`` would let through — and on a full disk some ranks
see only torch's zip writer's "unexpected pos", with no errno: the free space of the folder's file system
tells that case apart.
"""

from __future__ import annotations

import errno
import os
from typing import Mapping

from ..errors import RingtrainError, one_line
from . import files
from .metadata import HINT_DAMAGED


def dcp_failure(doing: str, path: str, error: BaseException, damaged: bool = False) -> RingtrainError:
    """What DCP raised, as a ``RingtrainError``: what was being read or written, which rank, and the operating
    system's errno and path where one is at the bottom of it. DCP gathers every rank's failure into a
    ``CheckpointException`` — a ``BaseException``, which an ``except Exception`` would let through."""
    failures = getattr(error, "failures", None)
    found: list[tuple[int | None, BaseException]] = []
    if isinstance(failures, Mapping):
        for rank, wrapped in sorted(failures.items()):
            found.append((rank, wrapped[0] if isinstance(wrapped, tuple) else wrapped))
    else:
        found.append((None, error))
    # The rank whose failure has an operating system error under it, where one has (a full disk surfaces on some
    # ranks only as torch's zip writer's "unexpected pos"), else the first.
    causes = [(rank, failure, _os_error_in(failure)) for rank, failure in found]
    rank, first, cause = next((c for c in causes if c[2] is not None), causes[0])
    where = f"rank {rank}: " if rank is not None else ""
    full = cause is None and doing == "writing" and _free_bytes(path) is not None and _free_bytes(path) < _NEARLY_FULL
    if cause is not None or full:
        detail = (f"{where}[Errno {cause.errno}] {cause.strerror}" + (f": {cause.filename!r}" if cause.filename else "")
                  if cause is not None else f"{where}[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)} (torch said "
                  f"{one_line(first)!r}; {_free_bytes(path)} bytes are free where {path!r} is)")
        hint = ("check the checkpoint folder's space and permissions (df -h, ls -l); every rank must see the same "
                "folder (a shared file system across nodes).")
    else:
        detail = where + one_line(first)
        hint = (HINT_DAMAGED if doing == "reading" else "check the checkpoint folder's space and permissions; "
                "every rank must see the same folder (a shared file system across nodes).")
    kind = files.DamagedCheckpoint if damaged else RingtrainError
    return kind(f"{doing} the sharded checkpoint {path!r} failed: {detail}"
                + (f" (and {len(found) - 1} more rank(s))" if len(found) > 1 else ""), hint)


_NEARLY_FULL = 1 << 20  # bytes free under which a write that failed without an errno is taken for a full disk


def _os_error_in(error: BaseException) -> OSError | None:
    """The OSError with an errno under ``error`` (its causes and contexts), or None."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _free_bytes(path: str) -> int | None:
    """Bytes free to this user on the file system that holds ``path`` (its nearest existing parent), or None."""
    where = os.path.abspath(path)
    while where and not os.path.exists(where):
        where = os.path.dirname(where)
    try:
        got = os.statvfs(where)
    except (OSError, AttributeError):
        return None
    return got.f_bavail * got.f_frsize
