"""Proof that a post on the job's board comes from the job: an HMAC with a secret only the job holds.

The job's rendezvous store is a TCPStore: no authentication, anyone who reaches its port may write
any key. A post on the liveness board (board.py) can end the whole job and put a rank's name and an
error text in every node's report, so a local process (or, on a port that listens beyond loopback, a
machine on the network) could end a run with a forged "rank 1 failed". Every record a rank or an
agent writes on the board is therefore sealed — ``TAG + HMAC-SHA256(secret, full key + text) + ":" +
text`` — and a reader that holds the secret ignores what is not sealed by it (one line on stderr,
naming the key, once per key and process). The key is part of the MAC, so a genuine post cannot be
replayed under another rank's key or in another generation of the board.

The secret (``RINGTRAIN_JOB_SECRET``) reaches the workers through the environment only: never on a
command line (``ps`` shows those to every user), never in the store. ``ringtrain run`` makes one per
job on a single node; a multi-node job needs the same one on every node — the user's
``RINGTRAIN_JOB_SECRET`` or ``RINGTRAIN_JOB_SECRET_FILE`` (``job_secret``); a multi-node job given
neither runs unsealed, as before, and the launcher says so. A process that holds no secret (plain
torchrun, srun, ``rt.launch`` without one) writes and accepts unsealed posts: nothing changes there.

What this does not do: encrypt (anyone who reaches the store still reads every key), protect Gloo's
or NCCL's sockets, or make unpickled objects (``all_gather_object``) safe — README.md, "Security".
Torch-free: the launcher uses it before torch is imported.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import sys
import time
from typing import Mapping

from ..errors import RingtrainError

SECRET_ENV = "RINGTRAIN_JOB_SECRET"
SECRET_FILE_ENV = "RINGTRAIN_JOB_SECRET_FILE"
TAG = "rt-seal1:"
_MAC_CHARS = 64  # hex SHA-256


class Seal:
    """Seals and opens the board's records with one secret; ``Seal(None)`` seals nothing and accepts all."""

    def __init__(self, secret: str | None):
        self._key = secret.encode() if secret else None
        self._reported: set[str] = set()  # keys whose rejection was already said (one line per key)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> "Seal":
        return cls(environ.get(SECRET_ENV) or None)

    @property
    def active(self) -> bool:
        return self._key is not None

    @staticmethod
    def _mac(secret: bytes, key: str, text: str) -> str:
        return hmac.new(secret, key.encode() + b"\0" + text.encode(), hashlib.sha256).hexdigest()

    def seal(self, key: str, text: str) -> str:
        """``text`` as stored under ``key`` (the full store key): sealed when there is a secret."""
        return text if self._key is None else f"{TAG}{self._mac(self._key, key, text)}:{text}"

    def name(self, key: str) -> str:
        """A store key only the job's ranks can name (``key`` and a MAC of it): a claim nobody else can take first.
        Without a secret, ``key`` itself."""
        return key if self._key is None else f"{key}/{self._mac(self._key, key, 'name')[:16]}"

    def open(self, key: str, raw: bytes | str) -> str | None:
        """The text stored under ``key`` if the job wrote it; None (and one line on stderr) if not."""
        value = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        sealed = value.startswith(TAG) and value[len(TAG) + _MAC_CHARS:len(TAG) + _MAC_CHARS + 1] == ":"
        text = value[len(TAG) + _MAC_CHARS + 1:] if sealed else value
        if self._key is None:
            return text  # nothing to check with: a job without a secret accepts what it reads
        if sealed and hmac.compare_digest(value[len(TAG):len(TAG) + _MAC_CHARS], self._mac(self._key, key, text)):
            return text
        self.reject(key, "it is not sealed" if not sealed else "its seal does not match this job's secret")
        return None

    def reject(self, key: str, why: str) -> None:
        if key in self._reported:
            return
        self._reported.add(key)
        print(f"ringtrain: ignored a post on the job's store under {key!r}: {why} (another process wrote it, "
              f"or this node has another {SECRET_ENV} than the one that wrote it).", file=sys.stderr, flush=True)


def new_secret() -> str:
    return secrets.token_hex(32)


def user_secret(environ: Mapping[str, str] = os.environ) -> str | None:
    """The secret the user gave: ``RINGTRAIN_JOB_SECRET``, or the first line of ``RINGTRAIN_JOB_SECRET_FILE``."""
    given = environ.get(SECRET_ENV)
    if given:
        return given
    path = environ.get(SECRET_FILE_ENV)
    if not path:
        return None
    try:
        with open(path) as f:
            text = f.readline().strip()
    except OSError as e:
        raise RingtrainError(f"{SECRET_FILE_ENV}={path} cannot be read: {e.strerror}",
                             "point it at a file every node can read (mode 600), holding one line: the job's "
                             "secret (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`).") from e
    if not text:
        raise RingtrainError(f"{SECRET_FILE_ENV}={path} is empty",
                             "write the job's secret on its first line (the same file, or the same line, on "
                             "every node).")
    return text


def loopback_secret(home: str | None = None) -> str:
    """The secret of this user's jobs whose nodes all run on this machine (a master on a loopback address): kept
    in a file only this user can read, so every node's agent finds the same one and no other user's process can
    seal a post. Made once (the first agent to get there; the others read it)."""
    folder = os.path.join(home or os.path.expanduser("~"), ".cache", "ringtrain")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, "loopback-secret")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):  # another agent is writing it this instant
            with open(path) as f:
                if text := f.read().strip():
                    return text
            time.sleep(0.02)
        raise
    with os.fdopen(fd, "w") as f:
        f.write(new_secret())
    with open(path) as f:
        return f.read().strip()


def job_secret(multi_node: bool, environ: Mapping[str, str] = os.environ,
               loopback: bool = False) -> tuple[str | None, str | None]:
    """(the secret this agent hands its workers, a warning for the user or None).

    The user's secret if given; else one made now for a single-node job (nobody else needs it); else, for
    nodes that all run on this machine (``loopback``), this user's loopback secret; else none: the nodes of a
    multi-node job would each make their own and reject one another's posts."""
    given = user_secret(environ)
    if given:
        return given, None
    if not multi_node:
        return new_secret(), None
    if loopback:
        with contextlib.suppress(OSError):
            return loopback_secret(), None
    return None, (f"ringtrain run: warning: this multi-node job's board is not sealed: any process that reaches "
                  f"the master port can post a fake failure that ends the job.\nHINT: set {SECRET_ENV} (or "
                  f"{SECRET_FILE_ENV}, a file holding it) to the same secret on every node; see README.md, "
                  "\"Security\".")
