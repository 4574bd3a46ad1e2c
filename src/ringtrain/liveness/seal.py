"""Proof that a post on the job's board comes from the job: an HMAC with a key only the job's ranks hold.

The job's rendezvous store is a TCPStore: no authentication, anyone who reaches its port may write
any key. A post on the liveness board (board.py) can end the whole job and put a rank's name and an
error text in every node's report, so a local process (or, on a port that listens beyond loopback, a
machine on the network) could end a run with a forged "rank 1 failed". Every record a rank or an
agent writes on the board is therefore sealed — ``TAG + job + ":" + HMAC-SHA256(key, full store key +
text) + ":" + text`` — and a reader that holds the secret ignores what is not sealed for its job (one
line on stderr, naming the key, once per key and process).

**Bound to the job.** The store keys are the same in every job (``ringtrain/live/0-0/rank/1``),
and so can the secret be: the user's ``RINGTRAIN_JOB_SECRET`` set for several jobs, the loopback secret
every two-node job on this machine reads. A post sealed with the secret alone could be recorded from one
job's store and replayed into another's. So the secret seals only the ranks' hellos; every other record
is sealed with the *job's key*, ``for_job``: an HMAC of the secret over the generation's prefix and every
rank's hello, each holding a nonce its rank drew as it joined (board.py, ``Board.bind``). Each rank puts
its own hello, as it wrote it, in the key it derives, so its key is one no other job or attempt ever had,
whatever anyone wrote in the store: a post copied from elsewhere opens nowhere ("sealed for another
job"), and a hello copied from elsewhere only makes the ranks that read it derive a key nobody else
holds (their posts then go unheard: a denial, said on stderr, never another job's word taken). A
reader that said no hello of its own (the launcher's agent) binds only to a set of hellos holding
something it knows is fresh: its agent's nonce (``RINGTRAIN_AGENT_NONCE``, drawn per ``ringtrain run``), which
its workers put in theirs. ``job`` (16 hex characters, public) names the job's key in each seal, so a
reader tells a replay from a forgery; the secret's own seal (hellos) has ``job == ""``.

The secret (``RINGTRAIN_JOB_SECRET``) reaches the workers through the environment only: never on a
command line (``ps`` shows those to every user), never in the store. ``ringtrain run`` makes one per
job on a single node; a multi-node job needs the same one on every node — the user's
``RINGTRAIN_JOB_SECRET`` or ``RINGTRAIN_JOB_SECRET_FILE`` (``job_secret``), or the loopback secret of
nodes that all run on this machine; a multi-node job given neither runs unsealed, as before, and the
launcher says so. A process that holds no secret (plain torchrun, srun, ``rt.launch`` without one)
writes and accepts unsealed posts: nothing changes there.

What this does not do: encrypt (anyone who reaches the store still reads every key), protect Gloo's
or NCCL's sockets, or make unpickled objects (``all_gather_object``) safe — docs/security.md.
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

from ..errors import RingtrainError

# The secret and the agent's nonce reach a worker as the launcher contract's variables (parallel/contract.py:
# RINGTRAIN_JOB_SECRET, RINGTRAIN_JOB_SECRET_FILE, RINGTRAIN_AGENT_NONCE); whoever makes a seal or a board reads
# them there and hands them in. The nonce is no secret (it may show anywhere): each worker's hello carries it, so
# that the agent knows which hellos on the store are its own job's (board.py, ``bind``).
SECRET_NAME = "RINGTRAIN_JOB_SECRET"  # the words of the messages below (the contract's table has the variable)
SECRET_FILE_NAME = "RINGTRAIN_JOB_SECRET_FILE"
TAG = "rt-seal2:"
_MAC_CHARS = 64  # hex SHA-256
_JOB_CHARS = 16  # the public name of a job's key


class Seal:
    """Seals and opens the board's records with one key; ``Seal(None)`` seals nothing and accepts all.

    ``Seal(secret)`` is the secret's own seal (the hellos'); ``for_job`` gives the seal of one job."""

    def __init__(self, secret: str | None):
        self._key = secret.encode() if secret else None
        self.job = ""  # the public name of this seal's job key; "" for the secret's own seal
        self._reported: set[str] = set()  # keys whose rejection was already said (one line per key)

    @property
    def active(self) -> bool:
        return self._key is not None

    def for_job(self, identity: str) -> "Seal":
        """The seal of one job: a key derived from the secret and ``identity`` (the generation's prefix and every
        rank's hello, board.py). Lines already said are not said again by it. Without a secret: this seal."""
        if self._key is None:
            return self
        bound = Seal(None)
        bound._key = hmac.new(self._key, b"ringtrain job key\0" + identity.encode(), hashlib.sha256).digest()
        bound.job = hmac.new(bound._key, b"job", hashlib.sha256).hexdigest()[:_JOB_CHARS]
        bound._reported = self._reported
        return bound

    @staticmethod
    def _mac(secret: bytes, key: str, text: str) -> str:
        return hmac.new(secret, key.encode() + b"\0" + text.encode(), hashlib.sha256).hexdigest()

    def seal(self, key: str, text: str) -> str:
        """``text`` as stored under ``key`` (the full store key): sealed when there is a secret."""
        return text if self._key is None else f"{TAG}{self.job}:{self._mac(self._key, key, text)}:{text}"

    def name(self, key: str) -> str:
        """A store key only the job's ranks can name (``key`` and a MAC of it): a claim nobody else can take first.
        Without a secret, ``key`` itself."""
        return key if self._key is None else f"{key}/{self._mac(self._key, key, 'name')[:16]}"

    @staticmethod
    def job_of(raw: bytes | str) -> str | None:
        """The job a stored value says it is sealed for ("" for the secret's own seal); None if it is not sealed."""
        parsed = _parse(raw.decode(errors="replace") if isinstance(raw, bytes) else raw)
        return None if parsed is None else parsed[0]

    def open(self, key: str, raw: bytes | str) -> str | None:
        """The text stored under ``key`` if this seal's job wrote it; None (and one line on stderr) if not."""
        value = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        parsed = _parse(value)
        if self._key is None:
            return value if parsed is None else parsed[2]  # nothing to check with: accept what it reads
        if parsed is None:
            self.reject(key, f"it is not sealed (another process wrote it, or a node that has no {SECRET_NAME})")
            return None
        job, mac, text = parsed
        if job != self.job:
            self.reject(key, self._other_job(job))
            return None
        if not hmac.compare_digest(mac, self._mac(self._key, key, text)):
            self.reject(key, f"its seal does not match this job's secret (another process wrote it, or this node "
                             f"has another {SECRET_NAME} than the one that wrote it)")
            return None
        return text

    def _other_job(self, job: str) -> str:
        if self.job and job:
            return ("it was sealed for another job: a post copied from another job's store (or another attempt's) "
                    f"and written here, or sealed with another {SECRET_NAME}; not by this job's ranks")
        if self.job:
            return ("it is sealed with the job's secret alone, not with this job's key: copied from another job's "
                    "store (a hello, or a post of a process that never learnt its job's key), not by this job's ranks")
        return ("it is sealed with the key of a job this process could not learn (the hellos of the job's ranks on "
                "the store are missing, or not theirs)")

    def reject(self, key: str, why: str) -> None:
        if key in self._reported:
            return
        self._reported.add(key)
        print(f"ringtrain: ignored a post on the job's store under {key!r}: {why}.", file=sys.stderr, flush=True)


def _parse(value: str) -> tuple[str, str, str] | None:
    """(job, MAC, text) of a sealed value; None when it is not one."""
    if not value.startswith(TAG):
        return None
    job, colon, rest = value[len(TAG):].partition(":")
    mac, colon2, text = rest.partition(":")
    if not (colon and colon2) or len(mac) != _MAC_CHARS or len(job) not in (0, _JOB_CHARS):
        return None
    return job, mac, text


def new_nonce() -> str:
    return secrets.token_hex(16)


def new_secret() -> str:
    return secrets.token_hex(32)


def user_secret(given: str | None, path: str | None) -> str | None:
    """The secret the user gave: ``given`` (``RINGTRAIN_JOB_SECRET``), or the first line of the file ``path``
    (``RINGTRAIN_JOB_SECRET_FILE``)."""
    if given:
        return given
    if not path:
        return None
    try:
        with open(path) as f:
            text = f.readline().strip()
    except OSError as e:
        raise RingtrainError(f"{SECRET_FILE_NAME}={path} cannot be read: {e.strerror}",
                             "point it at a file every node can read (mode 600), holding one line: the job's "
                             "secret (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`).") from e
    if not text:
        raise RingtrainError(f"{SECRET_FILE_NAME}={path} is empty",
                             "write the job's secret on its first line (the same file, or the same line, on "
                             "every node).")
    return text


def loopback_secret(home: str | None = None) -> str:
    """The secret of this user's jobs whose nodes all run on this machine (a master on a loopback address): kept
    in a file only this user can read, so every node's agent finds the same one and no other user's process can
    seal a post. Made once (the first agent to get there; the others read it). Every such job shares it, and that
    is harmless: what a job's ranks post is sealed with a key of that job alone (``Seal.for_job``), never with
    this secret, so a post copied from one of them into another is ignored."""
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


def job_secret(multi_node: bool, given: str | None = None, path: str | None = None,
               loopback: bool = False) -> tuple[str | None, str | None]:
    """(the secret this agent hands its workers, a warning for the user or None).

    The user's secret if given; else one made now for a single-node job (nobody else needs it); else, for
    nodes that all run on this machine (``loopback``), this user's loopback secret; else none: the nodes of a
    multi-node job would each make their own and reject one another's posts. ``given``, ``path``: the user's
    (``user_secret``)."""
    given = user_secret(given, path)
    if given:
        return given, None
    if not multi_node:
        return new_secret(), None
    if loopback:
        with contextlib.suppress(OSError):
            return loopback_secret(), None
    return None, (f"ringtrain run: warning: this multi-node job's board is not sealed: any process that reaches "
                  f"the master port can post a fake failure that ends the job.\nHINT: set {SECRET_NAME} (or "
                  f"{SECRET_FILE_NAME}, a file holding it) to the same secret on every node; see "
                  "docs/security.md.")
