"""The temporary files ringtrain writes before renaming them into place, and what a dead writer leaves.

Every atomic write (a checkpoint file, the manifest, the folder lock, the writability probe) goes
through a temporary file beside its target, named ``.<final name>.<writer>.<8 random>.tmp``
where the writer is ``<host hash>-<pid>``. A process killed mid-write (``kill -9``, the OOM
killer) leaves one behind, possibly as large as the checkpoint. Its name says who wrote it, so
the next save in that folder removes it once that writer is gone — and never touches one a live
process (or a process on another host, which cannot be checked from here) may still be writing.
A sharded checkpoint's staging folder (``sharded.staging_folder``) is named the same way, by the
rank that made it, and is removed the same way.

A write the operating system refuses (a full disk, a lost permission) is reported the same way
for every file: the path, what failed, and a HINT about space and permissions.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile

from ..errors import RingtrainError
from ..liveness import procs

TAGGED = re.compile(r"\.(?P<final>.+)\.(?P<writer>[0-9a-f]{8}-\d+)\.[a-z0-9_]{8}\.tmp")


def writer_tag() -> str:
    """``<host hash>-<pid>``: which process writes a temporary file, in its name (the hash covers the host,
    its boot and the pid namespace: procs.host_hash)."""
    return f"{procs.host_hash()}-{os.getpid()}"


def writer_gone(tag: str) -> bool:
    """Is the writer of a temporary file tagged ``tag`` gone? False while it lives, or where that cannot be
    checked (another host or pid namespace, no /proc): a file is never deleted under a writer that may still
    be writing it."""
    host, _, pid = tag.partition("-")
    if host != procs.host_hash() or not pid.isdigit() or not os.path.isdir("/proc"):
        return False
    return procs.ended(int(pid))  # no such process, or one that has ended (a zombie)


def temporary(folder: str, final_name: str) -> tuple[int, str]:
    """``mkstemp`` for a file that becomes ``final_name`` in ``folder``, named with this writer's tag."""
    return tempfile.mkstemp(prefix=f".{final_name}.{writer_tag()}.", suffix=".tmp", dir=folder)


def temporary_folder(folder: str, final_name: str) -> str:
    """``mkdtemp`` for a folder that becomes ``final_name`` in ``folder``, named with this writer's tag."""
    return tempfile.mkdtemp(prefix=f".{final_name}.{writer_tag()}.", suffix=".tmp", dir=folder)


def remove_dead_temporaries(folder: str) -> list[str]:
    """Delete the temporary files and staging folders in ``folder`` that a writer on this host left when it
    died; their names. A link is never followed (nor removed: ringtrain never makes one)."""
    removed = []
    for name in sorted(os.listdir(folder)):
        found = TAGGED.fullmatch(name)
        path = os.path.join(folder, name)
        if not found or os.path.islink(path) or not writer_gone(found["writer"]):
            continue
        with contextlib.suppress(FileNotFoundError):
            if os.path.isfile(path):
                os.unlink(path)
            elif os.path.isdir(path):
                shutil.rmtree(path)
            else:
                continue
            removed.append(name)
    return removed


def os_error_in(error: BaseException) -> OSError | None:
    """The ``OSError`` behind ``error``: itself, or what it was raised from or while handling (torch.save
    turns a full disk's ``OSError`` in the file's write into a ``RuntimeError`` from its zip writer)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def write_failed(what: str, path: str, error: OSError, kept: str) -> RingtrainError:
    """The error for a write the operating system refused: ``what`` (``"the checkpoint"``) at ``path``,
    and ``kept``, what is still there in its place."""
    return RingtrainError(
        f"cannot write {what} {path!r}: {error.strerror or error} ({type(error).__name__}, errno {error.errno})",
        f"check the folder's free space (df -h) and permissions (ls -ld), then try again; {kept}.")
