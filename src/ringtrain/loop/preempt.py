"""Preemption: a scheduler's signal becomes a checkpoint at the step the job is at, and a distinct exit.

A scheduler preempts with a signal and a grace period: Slurm sends SIGTERM (or ``--signal=USR1@90``'s signal
ahead of time), then SIGKILL after ``KillWait``; Kubernetes sends SIGTERM with
``terminationGracePeriodSeconds``; spot VMs give 30-120 s. ``ringtrain run``'s agent answers SIGTERM by
passing it to every worker and waiting (torchelastic's shutdown: 30 s, then SIGKILL).

Each rank of a ring with a ``checkpoint_dir`` takes SIGTERM (and ``Ring(preempt_signal=...)``'s signal) with
a handler that only notes it: nothing is interrupted, so a signal during a save — or a second signal — tears
nothing. At each safe point of the loop (the top of a ``ring.steps`` / ``ring.epochs`` iteration, a ring
loader's next batch) the ranks agree whether any of them was signalled: a one-number all-reduce (MAX), issued
at one safe point and read at the next, so it travels while the step computes and every rank learns the
answer at the same step. Then every rank saves that step (sharded under FSDP) and the process exits with
``EXIT_CODE`` (75, EX_TEMPFAIL: "try again"), which ``ringtrain run`` passes on.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from ..errors import RingtrainError
from ..liveness.activity import answers_preemption
from ..liveness.dump import PREEMPT_SIGNAL_ENV as SIGNAL_ENV  # ringtrain run --preempt-signal: the rings' default
from ..liveness.membership import has_left
from ..liveness.records import PREEMPTED_EXIT as EXIT_CODE

_NOT_PREEMPTION = tuple(getattr(signal, name) for name in ("SIGKILL", "SIGSTOP", "SIGINT", "SIGUSR2", "SIGCHLD")
                        if hasattr(signal, name))

class Preempted(SystemExit):
    """Raised at the safe point after the preemption checkpoint is on disk: the process ends with EXIT_CODE."""

    def __init__(self, message: str):
        super().__init__(EXIT_CODE)
        self.message = message


def signal_of(value: Any, what: str = "Ring(preempt_signal=...)") -> int | None:
    """``Ring(preempt_signal=...)``: ``"SIGUSR1"``, ``"USR1"``, ``signal.SIGUSR1``, ``10``, or None (SIGTERM
    alone)."""
    if value is None:
        return None
    if isinstance(value, signal.Signals) or (isinstance(value, int) and not isinstance(value, bool)):
        return int(value)
    text = str(value).strip().upper()
    if text.isdigit():
        found: Any = next((s for s in signal.Signals if s.value == int(text)), None)
    else:
        found = getattr(signal, text if text.startswith("SIG") else f"SIG{text}", None)
    if not isinstance(found, signal.Signals) or found in _NOT_PREEMPTION:
        raise RingtrainError(f"{what} got {value!r}, which is not a signal a scheduler preempts with",
                             "give the signal the scheduler sends ahead of the end, e.g. SIGUSR1 (Slurm's "
                             "--signal=USR1@90); SIGTERM is always taken. Not SIGKILL/SIGSTOP (they cannot be "
                             "caught), SIGINT (Ctrl-C stops the job) or SIGUSR2 (the stack request's).")
    return int(found)


def check_grace(value: Any, what: str = "Ring(preempt_grace=...)") -> float:
    """The seconds a preemption leaves before SIGKILL: a positive number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise RingtrainError(f"{what} got {value!r}",
                             "give the seconds the scheduler leaves between its signal and SIGKILL (e.g. 30).")
    return float(value)


GRACE_ENV = "RINGTRAIN_PREEMPT_GRACE"  # ``ringtrain run --preempt-grace``
MARKS_ENV = "RINGTRAIN_PREEMPTED_DIR"  # ringtrain run's agent: where its workers say they saved and left
DEFAULT_GRACE = 30.0  # torchelastic's shutdown wait, and Kubernetes' terminationGracePeriodSeconds default


def of(checkpoint_dir: Any, preempt_signal: Any, grace: Any, requeue: bool, environ: Any = None) -> "Preemption | None":
    """``Ring(preempt_signal=, preempt_grace=, requeue=)``, checked before the job forms; None without a
    ``checkpoint_dir`` (nothing to save: SIGTERM ends the process, as it does any program)."""
    environ = os.environ if environ is None else environ
    if checkpoint_dir is None:
        given = [name for name, value in (("preempt_signal", preempt_signal), ("preempt_grace", grace),
                                          ("requeue", requeue)) if value not in (None, False)]
        if given:
            raise RingtrainError(f"Ring got {', '.join(given)} without a checkpoint_dir",
                                 "a preemption is answered with a checkpoint: give checkpoint_dir=... (and "
                                 "save_every=...), or drop " + ", ".join(given) + ".")
        return None
    what = "Ring(preempt_signal=...)"
    if preempt_signal is None:
        preempt_signal, what = environ.get(SIGNAL_ENV) or None, SIGNAL_ENV
    if grace is None:
        text = environ.get(GRACE_ENV)
        try:
            grace = float(text) if text else DEFAULT_GRACE
        except ValueError:
            raise RingtrainError(f"{GRACE_ENV}={text!r} is not a number of seconds",
                                 f"set {GRACE_ENV} to the seconds a preemption leaves before SIGKILL, or unset it.")
    return Preemption(signal_of(preempt_signal, what), grace, requeue)


def requeue(environ: Any = None) -> str:
    """Under Slurm, put this job back in the queue (``scontrol requeue $SLURM_JOB_ID``, as Lightning's
    auto-requeue does): what happened, as a line to print."""
    import shutil
    import subprocess

    environ = os.environ if environ is None else environ
    job = environ.get("SLURM_JOB_ID")
    if not job:
        return "ringtrain: requeue asked for, but this is not a Slurm job (no SLURM_JOB_ID): nothing requeued"
    if shutil.which("scontrol") is None:
        return f"ringtrain: requeue asked for, but scontrol is not on PATH: Slurm job {job} not requeued"
    done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return f"ringtrain: scontrol requeue {job} failed: {(done.stderr or done.stdout).strip()}"
    return f"ringtrain: requeued Slurm job {job}: it resumes from this checkpoint when it runs again"


class Preemption:
    """The signals noted, and the ranks' agreement on them. ``grace``: the seconds a preemption leaves before
    SIGKILL (a checkpoint that takes longer is said at start-up); ``requeue``: under Slurm, requeue the job."""

    def __init__(self, extra_signal: int | None = None, grace: float = DEFAULT_GRACE, requeue: bool = False):
        self.grace, self.requeue = check_grace(grace), bool(requeue)
        self.signals = [int(signal.SIGTERM)] + ([extra_signal] if extra_signal not in (None, signal.SIGTERM) else [])
        self.requested: int | None = None  # the signal, once one came
        self._previous: dict[int, Any] = {}
        self._pending: tuple[Any, Any] | None = None  # (the engine's work, its tensor): the agreement in flight
        self.agreed = False

    def install(self) -> bool:
        """Take the signals (main thread only); False where signals cannot be taken here."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._note)
        if signal.SIGUSR1 in self.signals and signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL:
            import faulthandler

            # SIGUSR1 was the stack request (liveness/dump.stack_signal): stacks move to SIGUSR2.
            faulthandler.register(signal.SIGUSR2, all_threads=True, chain=False)
        return True

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    @answers_preemption  # the watchdog tells the launcher this rank saves when preempted (liveness.activity)
    def _note(self, signum: int, frame: Any) -> None:
        if has_left() or (signum == signal.SIGTERM and not agent_signalled()):
            # The rank already posted how it leaves (an error escaped, the script ended), or its ringtrain run was
            # not signalled: torchrun's agent is stopping it (a failure, a restart, a node joining), and nothing is
            # to be saved. The signal's own action, at once.
            self.uninstall()
            restored = signal.getsignal(signum)
            if restored == self._note or getattr(restored, "__func__", None) is Preemption._note:
                # A ring's note that was never uninstalled (its ring not closed): it would answer this again.
                signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        # Only a note: a save in progress finishes, and a second signal changes nothing.
        if self.requested is None:
            self.requested = signum
            print(f"ringtrain: got {signal.Signals(signum).name}: finishing this step, then a checkpoint and exit "
                  f"{EXIT_CODE} (preempted)", file=sys.stderr, flush=True)

    def due(self, world_size: int) -> bool:
        """At a safe point: do the ranks agree that one of them was signalled? The answer of the agreement
        issued at the previous safe point (one round behind); then the next is issued."""
        if self.agreed:
            return True
        if world_size <= 1:
            self.agreed = self.requested is not None
            return self.agreed
        import torch
        import torch.distributed as dist

        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            self._pending = None
            if int(flag.item()) > 0:
                self.agreed = True
                return True
        flag = torch.tensor([1 if self.requested is not None else 0], dtype=torch.int64)
        self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True), flag)
        return False

    def settle(self) -> None:
        """The loop is over: wait for the agreement in flight (every rank issued it), so nothing is left pending."""
        if self._pending is not None:
            work, _ = self._pending
            self._pending = None
            work.wait()


def stop(held: Any, settle: bool = True) -> None:
    """The ring closes: SIGTERM ends the process again; on a clean exit, after the agreement in flight."""
    preemption, held.preemption = held.preemption, None
    if preemption is not None:
        preemption.uninstall()
        if settle:
            preemption.settle()


SIGNALLED = "signalled"  # the file ringtrain run's agent writes in its marks folder when a signal reaches it
CONFIRM_S = 1.0  # how long a worker's SIGTERM waits for its agent's word (a scheduler signals both at once)


def agent_signalled(environ: Any = None, wait_s: float = CONFIRM_S) -> bool:
    """Is a SIGTERM to this worker its launcher's passing on a preemption? torchrun's agent stops its workers
    with SIGTERM for its own reasons too (a failed peer, a restart, a node joining an elastic job), which must end
    them at once. Under ``ringtrain run`` the agent writes ``SIGNALLED`` when a signal reaches *it* (Slurm
    signals every process of the step together: waited for up to ``wait_s``); elsewhere (plain torchrun, srun,
    one process) there is no one to ask, and every SIGTERM is a preemption."""
    import time

    folder = (os.environ if environ is None else environ).get(MARKS_ENV)
    if not folder:
        return True
    deadline = time.monotonic() + wait_s
    while True:
        if os.path.exists(os.path.join(folder, SIGNALLED)):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def mark(rank: int, step: int, environ: Any = None) -> None:
    """This rank's checkpoint of ``step`` is on disk and it leaves preempted: a file in the folder its node's
    ``ringtrain run`` gave (``RINGTRAIN_PREEMPTED_DIR``), which that agent reads once its workers are gone —
    a local file, where the job's store may already be gone with node 0."""
    folder = (os.environ if environ is None else environ).get(MARKS_ENV)
    if folder and os.path.isdir(folder):
        with open(os.path.join(folder, f"rank{rank}"), "w") as f:
            f.write(str(step))


def marked(folder: str | None) -> dict[int, int]:
    """The ranks of this node that left preempted, and the step each saved (``mark``)."""
    found: dict[int, int] = {}
    if not folder or not os.path.isdir(folder):
        return found
    for name in os.listdir(folder):
        try:
            with open(os.path.join(folder, name)) as f:
                found[int(name.removeprefix("rank"))] = int(f.read().strip())
        except (OSError, ValueError):
            continue
    return found
