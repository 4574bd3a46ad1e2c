"""One checkpoint folder, one job: the lock ``ringtrain.lock`` in a ``checkpoint_dir``.

Two jobs writing one folder resume each other's state and delete each other's files. So the
main process of a job (rank 0; the Resumer tells the other ranks what it found) holds the
folder from ``Ring(...)`` until ``ring.close()`` or the end of the process: ``ringtrain.lock``
names it — host, boot id, pid namespace, pid, the process's start time (liveness/procs.py), the
job (the launcher's run id) and when it took the folder.

* **Taking a free folder.** The record is written to a temporary file first and linked to its
  final name (``link`` fails when the name exists: an atomic create, like ``O_EXCL``, that never
  shows a half-written lock). Of two jobs creating it at once exactly one succeeds, with or
  without ``flock``; the other then judges the winner's lock like any other.
* **A live holder refuses.** On this host, in this pid namespace, the holder is alive when its pid
  exists, is not a zombie, and started when the lock says it did (a reused pid is another process).
* **Only a holder proven gone is taken over, with a message**: on this host, boot and pid namespace,
  its pid gone, a zombie, or another process (another start time) — a job killed with ``kill -9``
  and started again, torchrun restarting its workers (``--max-restarts``) —, or a lock of this host
  from before it last restarted (another boot id). A holder on another host, or in another pid
  namespace (``unshare --pid``, a container), or one this process's ``/proc`` cannot show (``unshare
  --pid`` without ``--mount-proc``) cannot be checked from here: refused, whatever run id it carries.
  A run id is what a launcher was told (torchrun's ``--rdzv-id 456`` as tutorials write it, a Slurm
  job id), and two jobs can be told the same one (two torchrun jobs given --rdzv-id 456): it proves nothing. The refusal
  names the holder (host, pid, pid namespace, run id, since when) and the ways out: stop that job,
  give this run its own folder, or — known dead — delete the lock.
* **One take-over per gone holder**, with or without ``flock``. A take-over first creates the
  holder's claim ``ringtrain.lock.takeover-<hash of its token>`` (the same atomic create), then
  checks the lock still names that holder, replaces it, and removes the claim. Of two contenders
  only one creates the claim; the other waits for it to finish and judges the new holder (alive:
  refused). One that read the gone holder long ago and claims it late finds the lock names someone
  else, and judges that one. While the lock names a gone holder only the creator of that holder's
  claim replaces it (the holder is gone, and a token is never written again), so the lock cannot
  change between that check and the replace. Where the file system has ``flock``, check and
  take-over also run under an ``flock`` of the folder itself (older versions rely on it), and a
  claim whose creator was killed in the middle of its take-over (a window of microseconds) is
  cleared. Where it has none (detected: ``flock`` answers ENOLCK or EOPNOTSUPP, as on some network
  file systems) nothing tells such a claim from one in use: the take-over is refused, naming both
  files to delete by hand, or a file system with locks to use.
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
import hashlib
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Iterator

from ..errors import RingtrainError
from ..liveness.procs import ProcessId
from .temporaries import temporary

LOCK = "ringtrain.lock"
CLAIM_WAIT = 5.0  # seconds a contender waits for another's take-over (a few milliseconds) to finish
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF)
_NO_LINK = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS)


@dataclass(frozen=True)
class Owner:
    """Who holds a folder; what ``ringtrain.lock`` (and a take-over's claim) holds."""

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

    def describe(self, doing: str = "holding it") -> str:
        about = [f"pid namespace {self.pidns}"] if self.pidns else []
        about += [self.job] if self.job else []
        return f"pid {self.pid} on host {self.host} ({', '.join([*about, f'{doing} since {self.since}'])})"

    def same_process(self, other: "Owner") -> bool:
        return self.process == other.process

    def state(self) -> str:
        """``ProcessId.status``: ``"alive"``, ``"gone"``, ``"rebooted"`` or ``"elsewhere"`` (another machine or
        pid namespace: cannot be checked from here)."""
        return self.process.status()


@contextlib.contextmanager
def _guard(folder: str) -> Iterator[bool]:
    """An exclusive ``flock`` on the folder while the lock is checked and taken; whether one is held (not on a
    file system without ``flock``: some network file systems)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            flocked = True
        except OSError as e:
            if e.errno not in _NO_FLOCK:
                raise
            flocked = False
        yield flocked
    finally:
        os.close(fd)  # closing the descriptor releases the flock


class FolderLock:
    """The lock of one checkpoint folder, held by this process once ``acquire`` returned."""

    def __init__(self, folder: str):
        self.folder = folder
        self.path = os.path.join(folder, LOCK)
        self.owner: Owner | None = None

    def claim_path(self, holder: Owner) -> str:
        """The file a take-over from ``holder`` is claimed by (one per holding: its token names it)."""
        return f"{self.path}.takeover-{hashlib.sha1(holder.token.encode()).hexdigest()[:16]}"

    def acquire(self, job: str | None) -> str | None:
        """Take the folder for this process; a message when a gone holder's lock was taken over.
        Raises when another job holds it, or may (a holder that cannot be checked from here)."""
        me = Owner.me(job)
        with _guard(self.folder) as flocked, self._staged(me) as staged:
            message = self._take(me, staged, flocked)
        self.owner = me
        atexit.register(self.release)
        return message

    def _take(self, me: Owner, staged: str, flocked: bool) -> str | None:
        deadline = time.monotonic() + CLAIM_WAIT
        while True:
            holder = self._read(self.path)
            if holder is None:
                if self._create(staged, self.path, me):
                    return None
                continue  # created meanwhile by another job (and maybe removed again): look again
            if holder.same_process(me):  # a second Ring in this process (or our own create, answered twice)
                os.replace(staged, self.path)
                return None
            message = self._take_over(holder, me)  # raises unless the holder is proven gone
            claim = self.claim_path(holder)
            if self._create(staged, claim, me) or self._mine(claim, me):
                try:
                    now = self._read(self.path)
                    if now is not None and now.token == holder.token:  # nobody else can change it now (above)
                        os.replace(staged, self.path)
                        return message
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(claim)
                continue  # another took it over first: judge the new holder
            self._wait_for(claim, holder, flocked, deadline)

    def _take_over(self, holder: Owner, me: Owner) -> str:
        """The message for taking the folder from ``holder``, or the refusal unless it is proven gone."""
        state = holder.state()
        if state == "alive":
            raise RingtrainError(
                f"checkpoint_dir {self.folder!r} is in use by another job: {holder.describe()}, which is still running",
                f"give this run a checkpoint_dir of its own, or stop that job first (kill {holder.pid} on "
                f"{holder.host}) and start again: the folder is taken over and its newest checkpoint resumed.")
        if state not in ("gone", "rebooted"):  # "elsewhere": it cannot be checked from here
            where = (f"host {me.host}" if holder.host != me.host else "another pid namespace of this host"
                     if holder.pidns != me.pidns else "here (this process's /proc shows another pid namespace: "
                     "unshare --pid without --mount-proc?)")
            same = (f"; the same run id ({me.job}) does not make it the same job: a run id is what the launcher was "
                    "told (torchrun's --rdzv-id, a Slurm job id), and two jobs can be told the same one"
                    if me.job and holder.job == me.job else "")
            raise RingtrainError(
                f"checkpoint_dir {self.folder!r} is locked by {holder.describe()}; from {where} it cannot be told "
                f"whether that job is still running{same}",
                f"stop that job, or give this run a checkpoint_dir of its own; if you know it is not running, delete "
                f"{self.path} and start again (this run then takes the folder and resumes its newest checkpoint).")
        return (f"ringtrain: took over checkpoint_dir {self.folder} from {holder.describe()}, "
                + ("which ran before this machine restarted" if state == "rebooted" else "which is no longer running"))

    def _wait_for(self, claim: str, holder: Owner, flocked: bool, deadline: float) -> None:
        """Another's claim on ``holder``: give its take-over time to end, clear it if its creator is gone and the
        folder's flock is held, or refuse."""
        try:
            claimant = self._read(claim)
        except RingtrainError:
            claimant = None  # being written (a file system without hard links), or not ringtrain's
        if claimant is not None and claimant.state() in ("gone", "rebooted"):
            if flocked:  # every contender takes the flock first: nobody is between its claim and its replace
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(claim)
                return
            raise RingtrainError(
                f"checkpoint_dir {self.folder!r} is locked by {holder.describe()}, which is no longer running, and "
                f"another job ({claimant.describe('claiming it')}) was killed while taking it over: its claim "
                f"{claim} is left, and this file system has no flock to tell a claim left behind from one in use",
                f"if no other job is starting on this folder, delete {self.path} and {claim} and start again; or put "
                "checkpoint_dir on a file system with locks (a local disk, NFS with its lock manager), where ringtrain "
                "clears such a claim itself.")
        if time.monotonic() > deadline:
            who = claimant.describe("claiming it") if claimant is not None else "its claim unreadable"
            raise RingtrainError(
                f"checkpoint_dir {self.folder!r} is being taken over from {holder.describe()} by another job ({who}), "
                f"which has not finished in {CLAIM_WAIT:.0f} s",
                f"if that job is not running, delete {claim} and start again; otherwise give this run a checkpoint_dir "
                "of its own.")
        time.sleep(0.02)

    def release(self) -> None:
        """Remove the lock if it is still this holding's (idempotent)."""
        if self.owner is None:
            return
        atexit.unregister(self.release)
        owner, self.owner = self.owner, None
        with contextlib.suppress(OSError, RingtrainError):
            if (holder := self._read(self.path)) is not None and holder.token == owner.token:
                os.unlink(self.path)

    def _read(self, path: str) -> Owner | None:
        try:
            with open(path) as f:
                owner = Owner(**json.load(f))
            if not isinstance(owner.pid, int) or not all(isinstance(v, str) for v in (owner.host, owner.start, owner.token,
                                                                                      owner.pidns)):
                raise TypeError("the fields are not of their types")
            return owner
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as e:
            raise RingtrainError(
                f"the lock {path!r} of checkpoint_dir {self.folder!r} is unreadable ({type(e).__name__}: {e})",
                "ringtrain only ever writes it whole, so something else did: if no job uses the folder now, delete "
                "it and start again.") from e

    def _mine(self, claim: str, me: Owner) -> bool:
        """Whether ``claim`` is this process's own (a create a network file system answered "exists" to, on a retry)."""
        with contextlib.suppress(RingtrainError):
            return (owner := self._read(claim)) is not None and owner.token == me.token
        return False

    @contextlib.contextmanager
    def _staged(self, owner: Owner) -> Iterator[str]:
        """``owner``'s record, whole, in a temporary file of the folder: linked or renamed into place, then removed."""
        fd, tmp = temporary(self.folder, LOCK)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(asdict(owner), f)
                f.flush()
                os.fsync(f.fileno())
            yield tmp
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _create(self, staged: str, path: str, owner: Owner) -> bool:
        """Put the record ``staged`` at ``path`` only if there is none there (atomic: of two, one succeeds)."""
        try:
            os.link(staged, path)  # fails if the file exists: nobody ever sees it half-written
            return True
        except FileExistsError:
            return False
        except OSError as e:  # a file system without hard links: O_EXCL, then the record
            if e.errno not in _NO_LINK:
                raise
        try:
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(out, "w") as f:
            json.dump(asdict(owner), f)
            f.flush()
            os.fsync(f.fileno())
        return True
