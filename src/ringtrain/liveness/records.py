"""The records that cross processes: how a rank left (``Post``), where a live rank is (``Whereabouts``),
how a worker process ended as its node's agent saw it (``Exit``).

Each is written by one process and read by others — peers' watchdogs, the launcher's report —
through the job's store (JSON) or torchelastic's error file. One frozen dataclass per kind, with
its own JSON form, instead of dicts written and read in several places (torchelastic's
``ProcessFailure`` is the model). Torch-free: the launcher's worker entry and report use them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

# A rank preempted (a scheduler's signal, answered with a checkpoint: loop/preempt.py) exits with this status,
# EX_TEMPFAIL (sysexits.h): a temporary failure — run the same command again to resume. Its post says
# "finished", reason "preempted at step N"; ringtrain run exits with it when every rank did.
PREEMPTED_EXIT = 75
PREEMPTED = "preempted at step "


@dataclass(frozen=True)
class Blame:
    """The rank a stop is blamed on: ``rank 1 failed (ValueError: boom)``."""

    rank: int
    state: str  # "failed" | "finished" | "left" | "stuck" | "not responding" | "killed" | "unreachable"
    reason: str = "no reason given"
    stack: str | None = None  # where it was, for a stuck rank (its main thread's Python stack)

    def describe(self) -> str:
        if self.state == "killed":  # reason: "by SIGKILL (the OOM killer?) on host H, pid P"
            # A SIGTERM its agent did not send (exits.py posts no other) came from outside: a stop, not a kill.
            verb = "stopped" if self.reason.startswith(f"by SIGTERM ({SENT_TO_IT})") else "killed"
            return f"rank {self.rank} was {verb} {self.reason}"
        if self.state == "unreachable":  # the store's host is gone; which ranks went with it is not known here
            return f"the job's store {self.reason}"
        return f"rank {self.rank} {self.state} ({self.reason})"

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Blame | None":
        if not isinstance(data, dict) or "rank" not in data:
            return None
        return cls(int(data["rank"]), str(data.get("state", "left")), str(data.get("reason", "no reason given")),
                   data.get("stack"))


@dataclass(frozen=True)
class Post:
    """How a rank left: on the job's liveness board, and (as ``extraInfo["ringtrain"]``) in its error file.

    ``cause``: ``"own"`` (its own error or exit) or ``"peer"`` (stopped because of ``blame``);
    ``during``: the collective it was blocked in, when known.
    """

    rank: int
    state: str  # "failed" | "finished" | "left"
    reason: str
    time: float
    pid: int = 0
    cause: str = "own"
    blame: Blame | None = None
    during: str | None = None
    seq: int | None = None  # collectives it had issued on the default group when it posted (activity.engine_sequence)

    def as_blame(self) -> Blame:
        """Who to blame for this post: the rank it blames, else itself."""
        return self.blame or Blame(self.rank, self.state, self.reason)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Post":
        return cls(rank=int(data.get("rank", -1)), state=str(data.get("state", "left")),
                   reason=str(data.get("reason", "")), time=float(data.get("time", float("inf"))),
                   pid=int(data.get("pid") or 0), cause=str(data.get("cause", "own")),
                   blame=Blame.from_dict(data.get("blame")), during=data.get("during"),
                   seq=int(data["seq"]) if isinstance(data.get("seq"), int) else None)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Post":
        return cls.from_dict(json.loads(text))


# What a signal that ends a worker usually means, for the one line that blames it. A SIGTERM is posted only when its
# node's agent did not send it (launcher/exits.py): someone sent it to that worker, not to ringtrain run.
SENT_TO_IT = "sent to it, not to the launcher"
_SIGNAL_GUESS = {"SIGKILL": "the OOM killer?", "SIGSEGV": "a crash in native code", "SIGBUS": "a crash in native code",
                 "SIGABRT": "an abort in native code", "SIGTERM": SENT_TO_IT, "SIGINT": "interrupted"}


@dataclass(frozen=True)
class Exit:
    """How a worker process ended, as the agent of its node (``ringtrain run``) saw it.

    A rank killed by a signal posts nothing, and a peer can tell it is gone only on the same machine
    (its pid); the agent, which reaps it, posts this on its behalf (``Board.post_exit``).
    ``exitcode`` is the agent's: negative for a signal (-9: SIGKILL).
    """

    rank: int
    pid: int
    hostname: str
    exitcode: int
    time: float

    def as_blame(self) -> Blame:
        where = f"on host {self.hostname}, pid {self.pid}"
        if self.exitcode < 0:
            import signal

            try:
                name = signal.Signals(-self.exitcode).name
            except ValueError:
                name = f"signal {-self.exitcode}"
            guess = _SIGNAL_GUESS.get(name)
            return Blame(self.rank, "killed", f"by {name}{f' ({guess})' if guess else ''} {where}")
        return Blame(self.rank, "failed", f"its process exited with status {self.exitcode} without a word, {where}")


@dataclass(frozen=True)
class Whereabouts:
    """Where a live rank is, published by its watchdog thread (at most once a second).

    ``beat`` is when it was written (wall clock): a rank whose beat stops while others wait is
    frozen or stuck holding the GIL. ``phase`` is what ringtrain's own layers say the main thread
    does (``data``, ``forward``, ``backward``, ``optimizer``, ``checkpoint``, ``evaluation``,
    ``collective``, or ``""`` when unknown: a plain script); ``waiting`` the collective it is
    blocked in (seen on its stack), since ``waiting_since``; ``site`` the user's ``file:line`` it
    is at. ``seq`` counts the collectives ringtrain's own layers issued. ``times`` are the rolling
    milliseconds per step (``data``, ``sync``, ``step``) and the steps they cover.

    ``step_unknown`` says why ``step`` counts nothing, when it does not: a script that does not use the Ring (its
    loop is its own: ringtrain sees no step of it), or a ring whose loop has not begun; None: ``step`` is the
    ring's optimizer steps. ``preemptible``: this rank answers SIGTERM with a checkpoint (a ring with a
    ``checkpoint_dir``: loop/preempt.py), for the launcher's word on a preemption that saved nothing.
    ``computing_backward``: its main thread is inside autograd's backward and waits for no peer — its own code runs
    there (a backward hook, a custom Function), which a DDP backward that waits in the gradient all-reduce is not.

    ``checkpoint`` is the checkpoint it is in now (``ring.save``, ``ring.load``, ``the periodic
    checkpoint``: activity.checkpoint_call), None outside one — its ``phase`` may still say
    ``checkpoint`` after the call returned; ``issued`` the collectives it has issued on the job's
    default group (activity.engine_sequence: the same order on every rank), and ``checkpoint_at``
    how many it had issued when its checkpoint began: a peer outside the checkpoint that issued
    more went past the point where it should have joined it.
    """

    rank: int
    pid: int
    host: str  # host identity (hostname, boot id, pid namespace): pids compare only within one
    hostname: str
    beat: float
    step: int = 0
    epoch: int | None = None
    phase: str = ""
    phase_since: float = 0.0
    waiting: str | None = None
    waiting_since: float | None = None
    seq: int = 0
    site: str | None = None
    times: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None
    issued: int | None = None
    checkpoint_at: int | None = None
    step_unknown: str | None = None
    preemptible: bool = False
    computing_backward: bool = False

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> "Whereabouts":
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def doing(self) -> str:
        """``in backward (gradient all-reduce)`` / ``in its data step`` / ``in its own backward computation`` /
        ``in ring.save`` / ``outside any collective``."""
        if self.waiting:
            return f"in {self.waiting}"
        if self.checkpoint:
            return f"in {self.checkpoint}"
        if self.computing_backward:  # inside autograd, waiting for nobody: its own code runs (a hook, a Function)
            return "in its own backward computation"
        if self.phase and self.phase != "checkpoint":  # a checkpoint's phase outlives its call: only `checkpoint` says
            return f"in its {self.phase} step" if self.phase in ("data", "forward", "backward", "optimizer") \
                else f"in {self.phase}"
        return "outside any collective"

    def step_said(self) -> str:
        """``step 5`` (the step it is in: its optimizer steps taken, plus one), or why it is not known."""
        return f"step {self.step + 1}" if self.step_unknown is None else f"step unknown: {self.step_unknown}"

    def collective(self) -> str:
        """The collective it waits in, as a person reads it: ``the gradient all-reduce of step 5`` (DDP's, in
        backward), ``all_reduce(op=mean, float32[3]) #7``; ``no collective`` when it waits in none."""
        if not self.waiting:
            return "no collective"
        if "backward" in self.waiting:
            return f"the gradient all-reduce of {self.step_said()}" if self.step_unknown is None \
                else "the gradient all-reduce"
        return self.waiting
