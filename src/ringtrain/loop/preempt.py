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
from ..liveness.membership import has_left
from ..liveness.records import PREEMPTED_EXIT as EXIT_CODE
from ..parallel import contract
from ..parallel.contract import DEFAULT_GRACE, SIGNALLED, check_grace, mark, marked, signal_of  # noqa: F401 - the loop's names

class Preempted(SystemExit):
    """Raised at the safe point after the preemption checkpoint is on disk: the process ends with EXIT_CODE."""

    def __init__(self, message: str):
        super().__init__(EXIT_CODE)
        self.message = message




def of(checkpoint_dir: Any, settings: contract.Settings, requeue: bool,
       given: dict[str, Any] | None = None) -> "Preemption | None":
    """The ring's preemption, from its settings (``Ring(preempt_signal=, preempt_grace=)`` over ``ringtrain run``'s
    variables: contract.override); None without a ``checkpoint_dir`` (nothing to save: SIGTERM ends the process,
    as it does any program). ``given``: the script's keywords (None: not given), refused without a folder."""
    if checkpoint_dir is None:
        given = [name for name, value in (given or {}).items() if value is not None] + (["requeue"] if requeue else [])
        if given:
            raise RingtrainError(f"Ring got {', '.join(given)} without a checkpoint_dir",
                                 "a preemption is answered with a checkpoint: give checkpoint_dir=... (and "
                                 "save_every=...), or drop " + ", ".join(given) + ".")
        return None
    return Preemption(settings.preempt_signum, settings.preempt_grace, requeue, marks=settings.marks,
                      slurm_job=settings.slurm_job)


def requeue(job: str | None) -> str:
    """Under Slurm, put this job back in the queue (``scontrol requeue $SLURM_JOB_ID``, as Lightning's
    auto-requeue does): what happened, as a line to print. ``job``: the Slurm job's id (Settings.slurm_job)."""
    import shutil
    import subprocess

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
    SIGKILL (a checkpoint that takes longer is said at start-up); ``requeue``: under Slurm, requeue the job
    (``slurm_job``); ``marks``: the folder this node's ``ringtrain run`` reads (None: no agent to tell)."""

    def __init__(self, extra_signal: int | None = None, grace: float = DEFAULT_GRACE, requeue: bool = False, *,
                 marks: str | None = None, slurm_job: str | None = None):
        self.grace, self.requeue = check_grace(grace), bool(requeue)
        self.marks, self.slurm_job = marks, slurm_job
        self.signals = [int(signal.SIGTERM)] + ([extra_signal] if extra_signal not in (None, signal.SIGTERM) else [])
        self.requested: int | None = None  # the signal, once one came
        self.rank: int | None = None  # this process's (install), for the line the signal prints
        self.local_rank: int | None = None
        self._previous: dict[int, Any] = {}
        self._pending: tuple[Any, Any] | None = None  # (the engine's work, its tensor): the agreement in flight
        self.agreed = False

    def install(self, rank: int | None = None, local_rank: int | None = None) -> bool:
        """Take the signals (main thread only); False where signals cannot be taken here. ``rank``, ``local_rank``:
        this process's, for the line a signal prints."""
        self.rank, self.local_rank = rank, local_rank
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
        if has_left() or (signum == signal.SIGTERM and not agent_signalled(self.marks)):
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
            said = (f"got {signal.Signals(signum).name}: finishing this step, then a checkpoint and exit {EXIT_CODE} "
                    "(preempted)")
            if self.marks and agent_signalled(self.marks):
                # ringtrain run passed it to every worker of its node: one line for the node, not one per rank.
                if self.local_rank in (None, 0):
                    print(f"ringtrain: {said}; every rank of this node got it", file=sys.stderr, flush=True)
            else:
                who = "" if self.rank is None else f"rank {self.rank}: "
                print(f"ringtrain: {who}{said}", file=sys.stderr, flush=True)

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


CONFIRM_S = 1.0  # how long a worker's SIGTERM waits for its agent's word (a scheduler signals both at once)


def agent_signalled(folder: str | None, wait_s: float = CONFIRM_S) -> bool:
    """Is a SIGTERM to this worker its launcher's passing on a preemption? torchrun's agent stops its workers
    with SIGTERM for its own reasons too (a failed peer, a restart, a node joining an elastic job), which must end
    them at once. Under ``ringtrain run`` the agent writes ``SIGNALLED`` when a signal reaches *it* (Slurm
    signals every process of the step together: waited for up to ``wait_s``); elsewhere (plain torchrun, srun,
    one process) there is no one to ask, and every SIGTERM is a preemption. ``folder``: the agent's marks folder
    (Settings.marks)."""
    import time

    if not folder:
        return True
    deadline = time.monotonic() + wait_s
    while True:
        if os.path.exists(os.path.join(folder, SIGNALLED)):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
