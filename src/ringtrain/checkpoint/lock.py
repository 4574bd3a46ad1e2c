"""One checkpoint folder, one job: the lock ``ringtrain.lock`` in a ``checkpoint_dir``.

Two jobs writing one folder resume each other's state and delete each other's files. So the
main process of a job (rank 0; the Resumer tells the other ranks what it found) holds the
folder from ``Ring(...)`` until ``ring.close()`` or the end of the process: ``ringtrain.lock``
names it — host, boot id, pid namespace, pid, the process's start time (liveness/procs.py), the
job (the launcher's run id) and when it took the folder.

* **Taking it.** The record is written to a temporary file first and linked to its final name
  (``link`` fails when the name exists: an atomic create, like ``O_EXCL``, that never shows a
  half-written lock). Check and take-over run under an ``flock`` on the folder itself, so two
  jobs starting together cannot both take over the same stale lock (where the file system has
  no ``flock``, the create stays atomic and only that race is left open).
* **A live holder refuses.** On this host, in this pid namespace, the holder is alive when its pid
  exists, is not a zombie, and started when the lock says it did (a reused pid is another process).
* **A gone holder is taken over, with a message**: a job killed with ``kill -9`` and started
  again, or torchrun restarting its workers (``--max-restarts``). A holder on another host, or in
  another pid namespace of this one (``unshare --pid``, a container), cannot be checked from here: refused, unless it is the same job by its launcher's run id
  (a restart whose rank 0 moved), and the message says how to take the folder explicitly.
* **Released** on ``ring.close()``, and at the exit of the process otherwise (a process killed by
  a signal leaves it: the next job finds its holder gone); only a lock that is still this holding's
  (its token) is removed.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import errno
import fcntl
import json
import os
import uuid
from dataclasses import asdict, dataclass
from typing import Iterator, Mapping

from ..errors import RingtrainError
from ..liveness.procs import ProcessId
from .temporaries import temporary

LOCK = "ringtrain.lock"


def job_of(environ: Mapping[str, str]) -> str | None:
    """The job this process belongs to, as its launcher names it (the same on every rank and restart)."""
    run_id = environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":  # torchrun's default --rdzv-id "none" names no job
        return f"torchrun {run_id}"
    if environ.get("SLURM_JOB_ID"):
        return f"Slurm job {environ['SLURM_JOB_ID']}"
    return None


@dataclass(frozen=True)
class Owner:
    """Who holds a folder; what ``ringtrain.lock`` holds."""

    host: str
    boot: str
    pid: int
    start: str
    job: str | None
    since: str  # when it took the folder (UTC)
    token: str  # this holding's own id: a second Ring in one process replaces it, and releases only its own
    pidns: str = ""  # the holder's pid namespace ('' in a lock written before ringtrain recorded it)

    @classmethod
    def me(cls, job: str | None) -> "Owner":
        me = ProcessId.me()
        return cls(me.host, me.boot, me.pid, me.start, job,
                   datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"), uuid.uuid4().hex,
                   me.pidns)

    @property
    def process(self) -> ProcessId:
        return ProcessId(self.host, self.boot, self.pidns, self.pid, self.start)

    def describe(self) -> str:
        job = f"{self.job}, " if self.job else ""
        return f"pid {self.pid} on host {self.host} ({job}holding it since {self.since})"

    def same_process(self, other: "Owner") -> bool:
        return self.process == other.process

    def state(self) -> str:
        """``ProcessId.status``: ``"alive"``, ``"gone"``, ``"rebooted"`` or ``"elsewhere"`` (another machine or
        pid namespace: cannot be checked from here)."""
        return self.process.status()


@contextlib.contextmanager
def _guard(folder: str) -> Iterator[None]:
    """An exclusive ``flock`` on the folder while the lock is checked and taken (best effort)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:  # no flock on this file system (some network file systems)
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF):
                raise
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


class FolderLock:
    """The lock of one checkpoint folder, held by this process once ``acquire`` returned."""

    def __init__(self, folder: str):
        self.folder = folder
        self.path = os.path.join(folder, LOCK)
        self.owner: Owner | None = None

    def acquire(self, job: str | None) -> str | None:
        """Take the folder for this process; a message when a gone holder's lock was taken over.
        Raises when another job holds it (or may: a holder on another host)."""
        me = Owner.me(job)
        with _guard(self.folder):
            message = None
            while (holder := self._read()) is not None or not self._write(me, replace=False):
                if holder is None:
                    continue  # created and removed meanwhile, by a job on a file system with no flock: look again
                if not holder.same_process(me):
                    message = self._take_over(holder, me)
                self._write(me, replace=True)
                break
        self.owner = me
        atexit.register(self.release)
        return message

    def _take_over(self, holder: Owner, me: Owner) -> str:
        """The message for taking the folder from ``holder``, or the refusal when it may still be using it."""
        state = holder.state()
        if state == "alive":
            raise RingtrainError(
                f"checkpoint_dir {self.folder!r} is in use by another job: {holder.describe()}, which is still running",
                f"give this run a checkpoint_dir of its own, or stop that job first (kill {holder.pid} on "
                f"{holder.host}) and start again: the folder is taken over and its newest checkpoint resumed.")
        if state == "elsewhere" and not (me.job and holder.job == me.job):
            raise RingtrainError(
                f"checkpoint_dir {self.folder!r} is locked by {holder.describe()}; from "
                + (f"host {me.host}" if holder.host != me.host else "another pid namespace of this host")
                + " it cannot be told whether that job is still running",
                f"if it is not running, delete {self.path} and start again (this run then takes the folder over "
                "and resumes its newest checkpoint); otherwise give this run a checkpoint_dir of its own.")
        return (f"ringtrain: took over checkpoint_dir {self.folder} from {holder.describe()}, "
                + {"elsewhere": "an earlier attempt of this job",
                   "rebooted": "which ran before this machine restarted"}.get(state, "which is no longer running"))

    def release(self) -> None:
        """Remove the lock if it is still this holding's (idempotent)."""
        if self.owner is None:
            return
        atexit.unregister(self.release)
        owner, self.owner = self.owner, None
        with contextlib.suppress(OSError, RingtrainError):
            if (holder := self._read()) is not None and holder.token == owner.token:
                os.unlink(self.path)

    def _read(self) -> Owner | None:
        try:
            with open(self.path) as f:
                owner = Owner(**json.load(f))
            if not isinstance(owner.pid, int) or not all(isinstance(v, str) for v in (owner.host, owner.start, owner.token,
                                                                                      owner.pidns)):
                raise TypeError("the fields are not of their types")
            return owner
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as e:
            raise RingtrainError(
                f"the lock {self.path!r} of checkpoint_dir {self.folder!r} is unreadable ({type(e).__name__}: {e})",
                "ringtrain only ever writes it whole, so something else did: if no job uses the folder now, delete "
                "it and start again.") from e

    def _write(self, owner: Owner, replace: bool) -> bool:
        """Put ``owner`` in place, whole: over the old lock (``replace``), or only if there is none."""
        fd, tmp = temporary(self.folder, LOCK)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(asdict(owner), f)
                f.flush()
                os.fsync(f.fileno())
            if replace:
                os.replace(tmp, self.path)
                return True
            try:
                os.link(tmp, self.path)  # fails if the lock exists: nobody ever sees it half-written
            except FileExistsError:
                return False
            except OSError as e:  # a file system without hard links: O_EXCL, then the record
                if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                try:
                    out = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    return False
                with os.fdopen(out, "w") as f:
                    json.dump(asdict(owner), f)
                    f.flush()
                    os.fsync(f.fileno())
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
