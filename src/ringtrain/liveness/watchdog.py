"""The watchdog: one daemon thread per rank that looks at the board twice a second and acts.

It runs a list of checks, each one object with one job (docs/architecture.md, principle 13), in order; the
first that returns a verdict ends the process:

1. ``PeerPosts`` — a peer posted "failed": the job is lost, stop naming the rank that caused it (if
   that is this rank — a peer timed out waiting for it — this rank is the cause and says where it
   is); a peer that posted "finished" is remembered;
2. ``VanishedNeighbour`` — a same-host peer whose process is gone without a post counts as failed;
3. ``FinishedWhileBlocked`` — a peer finished while this rank stays blocked in a collective for
   ``grace`` seconds: it will never arrive — unless the peer had issued this collective too (its post's
   collective count is at least ours): then it completes, however late on a busy machine, and only a
   wait past the stall warning is taken for a stop;
4. ``Publisher`` — this rank's ``Whereabouts`` (records.py) on the board, at most once a second:
   step, phase, the collective it waits in, the user's line it is at, its step times;
5. ``StackAnswers`` — a request for stacks (a stall report, ``kill -USR1`` on the launcher) is
   answered with this rank's Python stack, read here, not by the main thread, which may be stuck;
6. ``CheckpointOnSomeRanks`` — this rank waits in a collective of ring.save / ring.load (or of the periodic
   checkpoint) for ``AFTER_S`` seconds while every other rank waits too, and one of them, outside any checkpoint,
   issued collectives past the point where the checkpoint began: ``if ring.is_main: ring.save(...)``, a proven
   deadlock (stall.one_sided_checkpoint). This rank is the cause: it says so with the fix, posts it, and ends;
7. ``StallInspector`` — blocked in a collective for ``stall_warning`` seconds *with no progress* (the
   step, the ring's collectives, the engine's collective count and the phase all stand still: a rank
   that spends most of each step waiting is moving, not stalled): one report for the job
   (the lowest waiting rank claims it) naming who waits, who has not arrived and where (its stack),
   who does not answer; again at growing intervals;
8. ``SlowRanks`` — rank 0: when one rank holds the others back, one line saying which and why, at
   most once an epoch.
"""

from __future__ import annotations

import abc
import contextlib
import os
import socket
import sys
import threading
import time
from typing import Any, Callable

from . import dump, failures, procs, stall
from .activity import (Activity, blocked_in, checkpoint_call, engine_sequence, format_stacks, in_backward,
                       in_collective, preemptible, user_site)
from .board import Board
from .records import Blame, Whereabouts

POLL_S = 0.5  # how often the watchdog reads the board
GRACE_S = 3.0  # how long a rank may sit in a collective after a peer finished before it is stopped
STALL_WARNING_S = 60.0  # Horovod's stall inspector's default
PUBLISH_S = 1.0
STOPPED_EXIT_CODE = 1

Verdict = tuple[str, dict[str, Any]]


def vanished_blame(rank: int) -> Blame:
    return Blame(rank, "failed", "its process ended without a word (killed by a signal, or os._exit?)")


class Check(abc.ABC):
    """One thing the watchdog looks at; ``look`` returns a verdict when this rank must stop."""

    @abc.abstractmethod
    def look(self, dog: "Watchdog") -> Verdict | None:
        """Look once (every poll); None: nothing that ends this rank."""


class PeerPosts(Check):
    def __init__(self) -> None:
        self.seen = 0

    def look(self, dog: "Watchdog") -> Verdict | None:
        try:
            count = dog.board.count()
        except (RuntimeError, OSError):
            # The store is gone: whoever hosted it (rank 0 without a launcher) has left.
            dog.finished = dog.finished or Blame(0, "left", "the job's rendezvous store closed")
            return None
        if count <= self.seen:
            return None
        self.seen = count
        for rank, entry in sorted(dog.board.read().items(), key=lambda kv: kv[1].time):
            if rank == dog.board.rank:
                continue
            if entry.state == "failed":  # the job is lost: blame the rank that caused it
                blame = entry.as_blame()
                if blame.rank == dog.board.rank:
                    return dog.own_verdict(blame, entry)
                return dog.verdict(blame, None)
            if dog.finished is None:
                dog.finished, dog.finished_seq = entry.as_blame(), entry.seq
            elif entry.seq is not None and dog.finished_seq is not None:
                dog.finished_seq = min(dog.finished_seq, entry.seq)  # the peer that issued the fewest collectives
        return None


class VanishedNeighbour(Check):
    # How long a vanished neighbour's agent gets to post how it ended ("killed by SIGKILL on host H", exits.py)
    # before this rank blames it with what it can see itself. PeerPosts reads that post first when it comes.
    AGENT_WAIT_S = 1.5

    def __init__(self) -> None:
        self.neighbours: dict[int, int] | None = None  # same-host peers: rank -> pid
        self.seen_gone: float | None = None

    def look(self, dog: "Watchdog") -> Verdict | None:
        if self.neighbours is None:
            self.neighbours = dog.board.neighbours()
            if self.neighbours is None:
                return None
        gone = dog.board.vanished(self.neighbours)
        if gone is None:
            return None
        if self.seen_gone is None:
            self.seen_gone = dog.now
        if dog.now - self.seen_gone < self.AGENT_WAIT_S:
            return None
        return dog.verdict(vanished_blame(gone), None)


class FinishedWhileBlocked(Check):
    def look(self, dog: "Watchdog") -> Verdict | None:
        if dog.finished is None or dog.blocked is None:
            return None
        grace = dog.grace
        mine = dog.sequence()
        if mine is not None and dog.finished_seq is not None and dog.finished_seq >= mine:
            # The peer had issued this collective before it finished: it completes, however late on a busy CPU.
            grace = max(grace, dog.stall_warning or STALL_WARNING_S)
        if dog.blocked_for() < grace:
            return None
        return dog.verdict(dog.finished, dog.blocked)


class Publisher(Check):
    def __init__(self) -> None:
        self.last = 0.0

    def look(self, dog: "Watchdog") -> None:
        if dog.now - self.last < PUBLISH_S:
            return None
        self.last = dog.now
        dog.board.publish(dog.whereabouts())
        return None


class StackAnswers(Check):
    NEWEST = 8  # requests looked at per round, at most

    def __init__(self) -> None:
        self.answered: int | None = None  # requests up to this number are settled
        self.done: set[int] = set()  # requests answered among the newest

    def look(self, dog: "Watchdog") -> None:
        try:
            newest = dog.board.stack_requests()
        except (RuntimeError, OSError):
            return None
        if self.answered is None:
            self.answered = newest  # requests from before this rank joined are not for it
            return None
        # Only the newest few, and only sealed ones: the counter is a plain store counter, and one add of 10**9 by
        # anyone who reaches the store must not keep this thread busy (nor a forged request make it answer). A
        # request whose record is not there yet is looked at again next round, while it is among the newest.
        window = range(max(self.answered + 1, newest - self.NEWEST + 1), newest + 1)
        self.done &= set(window)
        for number in window:
            kind = None if number in self.done else dog.board.request_kind(number)
            if kind is None:
                continue
            self.done.add(number)
            text = format_stacks(all_threads=kind == "all")
            dog.board.answer(number, text)
            if kind == "all":  # kill -USR1 / ringtrain stacks: every rank prints its own, prefixed
                print("\n".join(f"[rank {dog.board.rank}] {line}" for line in
                                [f"ringtrain: stacks of rank {dog.board.rank} (pid {os.getpid()}):", *text.splitlines()]),
                      file=sys.stderr, flush=True)
        self.answered = max(self.answered, newest - self.NEWEST)
        return None


class CheckpointOnSomeRanks(Check):
    # Long enough for every rank's word (published once a second) to show a wait that does not move, short beside the
    # stall warning (60 s) and the collective's timeout (30 min) the job would otherwise hang until.
    AFTER_S = 5.0

    def __init__(self, after_s: float = AFTER_S) -> None:
        self.after_s = after_s
        self.sure_since: float | None = None  # monotonic: since when this rank is for sure in a checkpoint's collective

    def look(self, dog: "Watchdog") -> Verdict | None:
        # Not while the engine does a checkpoint's local work (reads, a plan, copies: blocked_in counts them), which a
        # peer that is done with the checkpoint may wait for: only a collective call, in every round, for AFTER_S.
        if dog.checkpoint is None or dog.blocked is None or not in_collective(dog.activity):
            self.sure_since = None
            return None
        if self.sure_since is None:
            self.sure_since = dog.now
        if min(dog.blocked_for(), dog.now - self.sure_since) < self.after_s:
            return None
        views = dog.board.whereabouts()
        views[dog.board.rank] = dog.whereabouts()
        found = stall.one_sided_checkpoint(dog.board.rank, dog.board.world_size, views, time.time(), self.after_s)
        return None if found is None else dog.cause_verdict(*found)


class StallInspector(Check):
    def __init__(self) -> None:
        self.reports = 0  # reports made in the current stall
        self.next_at: float | None = None

    def look(self, dog: "Watchdog") -> None:
        if dog.blocked is None or dog.stall_warning is None:
            self.reports, self.next_at = 0, None
            return None
        waited = dog.blocked_for()
        due = dog.stall_warning * (2 ** (self.reports + 1) - 1)  # 60, 180, 420 ... s: growing intervals
        if waited < due:
            return None
        self.reports += 1
        views = dog.board.whereabouts()
        waiting_long = [r for r, v in views.items() if v.waiting and v.waiting_since
                        and time.time() - v.waiting_since >= dog.stall_warning and stall.responding(v, time.time())]
        if waiting_long and min(waiting_long) != dog.board.rank:
            return None  # the lowest waiting rank reports
        start = min((views[r].waiting_since for r in waiting_long), default=time.time() - waited)
        if not dog.board.claim(f"{int(start)}/{self.reports}"):
            return None
        others = [r for r in range(dog.board.world_size) if r != dog.board.rank
                  and not (r in views and views[r].waiting and stall.responding(views[r], time.time()))]
        number = dog.board.request_stacks() if others else 0
        stacks = dog.board.answers(number, others, 2.0) if number else {}
        views = dog.board.whereabouts()  # fresher, now that the others answered
        views[dog.board.rank] = dog.whereabouts()  # its own, now: waiting for the answers aged the one it published
        silent = [r for r in others if r not in stacks]
        states = dog.states_of(silent)
        stacks.update(dog.stacks_from_outside([r for r in silent if states.get(r) not in ("gone",)]))
        next_in = dog.stall_warning * 2 ** self.reports
        report = stall.stall_report(dog.board.rank, dog.board.world_size, views, stacks, states, next_in,
                                    hellos=dog.board.hellos_so_far())
        print(report + (f"\n{dog.note}" if dog.note else ""), file=sys.stderr, flush=True)
        return None


class SlowRanks(Check):
    EVERY_S = 5.0

    def __init__(self) -> None:
        self.last = 0.0
        self.said_in_epoch: set[Any] = set()

    def look(self, dog: "Watchdog") -> None:
        if dog.board.rank != 0 or dog.now - self.last < self.EVERY_S:
            return None
        self.last = dog.now
        epoch = dog.activity.epoch
        if epoch in self.said_in_epoch:
            return None
        found = stall.bottleneck(dog.board.whereabouts())
        if found is not None:
            self.said_in_epoch.add(epoch)
            print(found[1], file=sys.stderr, flush=True)
        return None


def default_checks(stopping: bool = True) -> list[Check]:
    """Every check; ``stopping=False`` keeps only those that observe (a plain script: no fail fast here)."""
    observe: list[Check] = [Publisher(), StackAnswers(), StallInspector()]
    if not stopping:
        return observe
    return [PeerPosts(), VanishedNeighbour(), FinishedWhileBlocked(), Publisher(), StackAnswers(),
            CheckpointOnSomeRanks(), StallInspector(), SlowRanks()]


class Watchdog(threading.Thread):
    """See the module docstring. ``stop`` is what ends the process (tests pass their own)."""

    def __init__(self, board: Board, activity: Activity | None = None, *, backward_syncs: bool,
                 error_file: str | None, interval: float = POLL_S, grace: float = GRACE_S,
                 stall_warning: float | None = STALL_WARNING_S, stop: Callable[[str, dict[str, Any]], None] | None = None,
                 checks: list[Check] | None = None, note: str | None = None,
                 sequence: Callable[[], int | None] = engine_sequence, under_agent: bool = False):
        super().__init__(name="ringtrain-watchdog", daemon=True)
        # What the main thread reports (its owner writes it: a ring, hvd.init); a plain script has nobody
        # writing one, and is read from its stack alone.
        self.activity = Activity() if activity is None else activity
        self._plain = activity is None  # its steps are its own loop's: none is counted here
        self.note = note  # a line stall reports end with (NCCL's flight recorder: flight.py)
        self.board = board.clone()
        self.backward_syncs = backward_syncs
        self.error_file = error_file
        self.under_agent = under_agent  # started by torchrun's agent: a stop takes the processes it started along
        self.interval, self.grace, self.stall_warning = interval, grace, stall_warning
        self.checks = default_checks() if checks is None else checks
        self.sequence = sequence  # collectives issued on the default group (activity.engine_sequence; tests: their own)
        self._stop_process = stop or self._end_process
        self._halt = threading.Event()
        self.finished: Blame | None = None  # a peer that left cleanly
        self.finished_seq: int | None = None  # ... and how many collectives it had issued then
        self.blocked: str | None = None  # the collective the main thread is in, this round
        self.checkpoint: str | None = None  # the checkpoint it is in, this round (activity.checkpoint_call) ...
        self.checkpoint_at: int | None = None  # ... and the collectives issued when it began
        self.issued: int | None = None  # collectives issued on the default group, this round
        self._blocked_since: float | None = None  # monotonic: since when blocked with no progress
        self._blocked_wall: float | None = None
        self._progress: tuple | None = None
        self.now = 0.0
        self._host, self._hostname = procs.host_identity(), socket.gethostname()

    def halt(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            verdict = self.check()
            if verdict is not None and not self._halt.is_set():
                self._stop_process(*verdict)
                return

    def check(self) -> Verdict | None:
        """One round: every check in order; (message, error-file info) when this rank must stop."""
        self.now = time.monotonic()
        self.blocked = blocked_in(self.activity, self.backward_syncs)
        self.checkpoint, self.checkpoint_at = checkpoint_call(self.activity) or (None, None)
        progress = self.progress()
        moved, self._progress = progress != self._progress, progress
        self.issued = progress[-1]
        if self.blocked is None:
            self._blocked_since = self._blocked_wall = None
        elif self._blocked_since is None or moved:  # the stall clock counts from the last progress, not a sample
            self._blocked_since, self._blocked_wall = self.now, time.time()
        for check in self.checks:
            verdict = check.look(self)
            if verdict is not None:
                return verdict
        return None

    def progress(self) -> tuple:
        """What moves while the rank works: its step, the ring's collectives, the engine's collective count, its
        loader's steps and its phase. A rank blocked in a collective whose progress stands still is stalled."""
        a = self.activity
        return a.step, a.calls, a.times.steps, a.phase, a.phase_since, self.sequence()

    def blocked_for(self) -> float:
        return 0.0 if self._blocked_since is None else self.now - self._blocked_since

    def whereabouts(self) -> Whereabouts:
        return Whereabouts(
            rank=self.board.rank, pid=os.getpid(), host=self._host, hostname=self._hostname, beat=time.time(),
            step=self.activity.step, epoch=self.activity.epoch, phase=self.activity.phase,
            phase_since=self.activity.phase_since, waiting=self.blocked, waiting_since=self._blocked_wall,
            seq=self.activity.calls, site=user_site(), times=self.activity.times.summary(),
            checkpoint=self.checkpoint, issued=self.issued, checkpoint_at=self.checkpoint_at,
            step_unknown=self._step_unknown(), preemptible=preemptible(),
            computing_backward=self.blocked is None and self.backward_syncs and in_backward())

    def _step_unknown(self) -> str | None:
        """Why this rank's step is not counted (Whereabouts.step_unknown), or None: a ring counts it."""
        if self.activity.counts_steps:
            return None
        return "the script does not use the Ring" if self._plain else "no ring loop has counted a step"

    def stacks_from_outside(self, ranks: list[int]) -> dict[int, str]:
        """The stacks of ``ranks`` on this host that did not answer, taken with a signal (dump.py): where they are
        now, even holding the GIL in native code."""
        hellos = self.board.hellos()
        taken = {r: dump.take(hellos[r]["pid"]) for r in ranks if r in hellos and hellos[r].get("host") == self._host}
        return {r: f"(taken from outside: it did not answer)\n{text}" for r, text in taken.items() if text}

    def states_of(self, ranks: list[int]) -> dict[int, str]:
        """The process state of ``ranks`` that live on this host (stopped, running...), from /proc."""
        hellos = self.board.hellos()
        return {r: procs.state(hellos[r]["pid"]) for r in ranks
                if r in hellos and hellos[r].get("host") == self._host}

    # --- verdicts -------------------------------------------------------------------------------
    def verdict(self, blame: Blame, during: str | None) -> Verdict:
        me = self.board.rank
        what = blame.describe()
        message = f"{what} while rank {me} called {during}" if during else f"{what}; the job cannot go on without it"
        post = self.board.post("failed", f"stopped: {message}", cause="peer", blame=blame, during=during)
        return f"ringtrain: rank {me} stops: {message}.", post.to_dict()

    def own_verdict(self, blame: Blame, by: Any) -> Verdict:
        """A peer timed out waiting for this rank: this rank is the cause; say where it is, and end."""
        me = self.board.rank
        stack = format_stacks()
        reason = f"{blame.state}: {blame.reason}"
        post = self.board.post("failed", reason, cause="own")
        info = post.to_dict()
        info["stack"] = stack
        message = (f"ringtrain: rank {me} stops: rank {by.rank} gave up waiting for it ({by.reason}); rank {me} "
                   f"was {blame.reason}. Its stack:\n{stack}")
        return message, info

    def cause_verdict(self, reason: str, hint: str) -> Verdict:
        """This rank is the cause (it waits in a collective its peers will never call): post why, so that they stop in
        seconds and the launcher's report names this rank, and end with the fix."""
        me = self.board.rank
        post = self.board.post("failed", reason, cause="own", during=self.blocked)
        info = post.to_dict()
        message = f"ringtrain: rank {me} stops: {reason}\nHINT: {hint}"
        info["stack"] = f"{format_stacks()}\n{message}"  # where it waits, then why, as a traceback ends with its error
        return message, info

    def _end_process(self, message: str, info: dict[str, Any]) -> None:
        print(message, file=sys.stderr, flush=True)
        line = message.removeprefix("ringtrain: ").splitlines()[0]
        failures.write_error_file(self.error_file, line, info.get("stack") or line, info)  # torchrun shows the 2nd
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        recorder = self.activity.recorder
        if recorder is not None:  # a timeline's part, up to here (the merge is left to whoever outlives us)
            with contextlib.suppress(Exception):
                recorder.close(merge=False)
        failures.stop_own_processes(self.under_agent)
        os._exit(STOPPED_EXIT_CODE)
