"""Saving a run and continuing it: ``Resumer``, which a ``Ring`` holds and delegates to.

The state machine, top to bottom:

0. construction — with a ``checkpoint_dir``, the main process makes the folder ready and takes it
   for this job (lock.py; ``release()`` gives it back), every rank told the outcome;
1. ``track(targets)`` — ``ring.setup`` hands over the model/optimizer/scheduler it made; with
   a ``checkpoint_dir`` they become the periodic save's contents, their configuration is
   recorded (fingerprint.py), and the newest complete checkpoint in the folder is loaded into
   them now if ``resume=`` allows it (policy.py; a restarted job resumes here);
2. ``add_loader(made)`` — a loader made after a load gets its saved position (the first training
   loader also gives the global batch, checked against the checkpoint's);
3. ``safe_point()`` — the loop is between two steps (the top of ``ring.steps``/``ring.epochs``, a ring
   loader's next batch, ``ring.close``): a resumed run's RNG is put back, a due periodic save is written
   (``autosave``; ``flush()`` waits for an asynchronous one still being written), a preemption agreed on
   by the ranks is answered with a checkpoint and exit 75 (loop/preempt.py);
4. ``save(path, **state)`` / ``load(path, **targets)`` — the user's own checkpoints (state_files.py).
"""

from __future__ import annotations

import signal
import time
from typing import Any

import torch
from torch import nn

from ..errors import RingtrainError
from ..liveness.records import PREEMPTED
from ..loop.data import RingLoader
from ..loop.held import Held
from ..loop.preempt import EXIT_CODE, Preempted, mark, requeue
from ..parallel import contract
from . import files, fingerprint, lock, policy, rng, sharded, state
from .folder import CheckpointDir
from .selfcheck import LossRecord, check_folder
from .state_files import StateFiles, resume_loader


class Resumer(StateFiles):
    """Checkpoints of one ring: when to save, where, and how to continue from one (saving and loading a path
    itself: state_files.py)."""

    def __init__(self, strategy: Any, held: Held, checkpoints: CheckpointDir | None = None, resume: str = "auto",
                 tolerance: float | None = None):
        super().__init__(strategy, held)
        self.checkpoints = checkpoints
        self.resume = "auto" if check_folder() else resume  # --check-resume's second run resumes, whatever the script says
        # The resumed run's self-check (selfcheck.py): every rank's losses, recorded beside the checkpoints.
        self.losses = None if checkpoints is None or tolerance is None else \
            LossRecord(checkpoints.folder, strategy.rank, tolerance)
        self._comparable = False  # resumed at the same world size and configuration: the same losses are due
        self._safe_points = 0  # regular safe points passed (a loop with none resumes inexactly, and says so)
        self._resumed: dict[str, Any] | None = None  # the fingerprint of the checkpoint resumed from, until checked
        self._resumed_from = ""
        self._lock: lock.FolderLock | None = None
        self._said_grace = False
        self._said_late = False
        self._said_finished = False
        self._claim()

    @staticmethod
    def checkpoint_dir(folder: str | None, save_every: int | None, keep_last: int,
                       resume: str = "auto") -> CheckpointDir | None:
        """``Ring(checkpoint_dir=, save_every=, keep_last=, resume=)``, checked before any process group forms."""
        policy.check_argument(resume, folder)
        checking = check_folder()
        if checking:  # ringtrain run --check-resume: every step saved into the check's folder, none dropped
            folder, save_every, keep_last = checking, 1, 10**6
        if save_every is not None and (not isinstance(save_every, int) or save_every < 1 or folder is None):
            raise RingtrainError(
                f"Ring got save_every={save_every!r} with checkpoint_dir={folder!r}",
                "save_every is a positive number of optimizer steps and needs checkpoint_dir=... to save into.",
            )
        return CheckpointDir(folder, keep_last) if folder else None

    # --- 1, 2: what the ring set up ------------------------------------------------------
    @staticmethod
    def save_every_of(save_every: int | None) -> int | None:
        """``ringtrain run --check-resume``: a checkpoint every step, whatever the script asked (checked above)."""
        return 1 if check_folder() else save_every

    def _claim(self) -> None:
        """The main process makes the folder ready and takes it for this job (lock.py); every rank
        gets the outcome, so a refusal raises on all of them."""
        if self.checkpoints is None:
            return

        def claim() -> list[str]:
            self.checkpoints.check_writable()  # a folder that cannot take a checkpoint is named now, not at step N
            self._lock = lock.FolderLock(self.checkpoints.folder)
            said = [self._lock.acquire(contract.read().job)]  # shown on the lock, never trusted
            try:
                self.checkpoints.prepare()
                if self.resume == "never" and self.strategy.env.restart_count == 0:
                    said.append(policy.set_aside(self.checkpoints))
            except BaseException:
                self.release()
                raise
            return [line for line in said if line]

        for line in self._agree(claim):
            self.say(line)

    def release(self, unless_saving: bool = False) -> None:
        """Give the checkpoint folder back (main process; ``ring.close``), or keep it while an asynchronous save
        is still being written (``unless_saving``: the process's exit gives it back)."""
        if self.losses is not None:
            self.losses.close()
        if self._lock is not None and not (unless_saving and self.saving):
            self._lock.release()

    def track(self, targets: dict[str, Any]) -> None:
        if self.checkpoints is None:
            return
        self._targets.update(targets)
        self._fingerprint["entries"].update(self._describe(targets))
        failed: dict[str, str] = {}  # read whole, did not load: set aside once an older one has (none may be theirs)
        while True:
            try:
                latest, said, self._resumed, self._comparable = self._agree(lambda: self._choose(list(targets), failed))
            except RingtrainError:
                self.release()  # refused: the folder is not this run's to hold
                raise
            for line in said:
                self.say(line)
            if latest is None:
                return
            self._resumed_from = latest
            try:
                self.load(latest, **targets)
            except files.DamagedCheckpoint as e:  # it read as whole on disk, but not its contents: the one before
                failed[latest] = e.message
                continue
            break
        for damaged, why in failed.items():  # an older one loaded: theirs was a fault of their own
            self.say(self._agree(lambda: self.checkpoints.set_aside(damaged, why, instead=latest)))  # type: ignore[union-attr]
        epoch = f"epoch {self.resume_epoch}, " if self.resume_epoch is not None else ""
        self.say(f"ringtrain: resumed from {latest} ({epoch}step {self.step.optimizer_steps})")
        self._say_if_slower_than_grace(self._agree(lambda: self.checkpoints.seconds_of(latest)))  # type: ignore[union-attr]

    def _describe(self, targets: dict[str, Any]) -> dict[str, Any]:
        """Fingerprints of the models (every rank's parameters united: a pipeline stage holds only its own)
        and optimizers in ``targets`` (collective)."""
        described = {}
        for name, target in targets.items():
            if isinstance(target, nn.Module):
                mine = {k: state.global_shape(p) for k, p in self.strategy.named_parameters(target).items()}
                shapes = {k: v for every in self.strategy.gather_object(mine) for k, v in every.items()}
                described[name] = fingerprint.of_module(shapes)
            elif isinstance(target, torch.optim.Optimizer):
                described[name] = fingerprint.of_optimizer(target)
        return described

    def _choose(self, names: list[str], failed: dict[str, str]) -> tuple[str | None, list[str], dict[str, Any] | None,
                                                                      bool]:
        """Main process: the checkpoint to resume from (or None; ``failed``: those that did not load, passed over),
        what to say, by ``resume=``, its fingerprint, and whether this run is the same as the one that wrote it
        (world size and configuration: the self-check's)."""
        latest = self.checkpoints.latest_readable(failed)  # type: ignore[union-attr]
        notes, self.checkpoints.notes = self.checkpoints.notes, []  # type: ignore[union-attr]
        if latest is None:
            return None, notes, None, False
        saved = fingerprint.saved_in(latest)
        if saved is None:
            return latest, notes, None, False  # written before checkpoints held their configuration: nothing to compare
        changed = fingerprint.differences(saved, self._run_fingerprint(), names)
        resized = policy.world_size_note(latest, saved, self.strategy.world_size)
        return latest, notes + (resized + policy.judge(self.resume, self.checkpoints.folder, latest, changed)), \
            saved, not changed and not resized  # type: ignore[union-attr]

    def add_loader(self, made: RingLoader) -> None:
        if self._resumed is not None and self.held.global_batch is not None:  # the first training loader
            self._check_batch(self._resumed)
        index = self.loaders.index(made)
        if index < len(self._loader_states):
            resume_loader(made, self._loader_states[index])

    def _check_batch(self, saved: dict[str, Any]) -> None:
        """The global batch, known once the first training loader is made, against the checkpoint's (every rank)."""
        self._resumed = None
        line, resized = fingerprint.batch_difference(saved, self.strategy.world_size, self.held.global_batch)
        if line is not None and resized:
            self.say(f"ringtrain: {line}, with the world size ({saved['world_size']} -> {self.strategy.world_size})")
        elif line is not None:
            try:
                said = policy.judge(self.resume, self.checkpoints.folder, self._resumed_from, [line])  # type: ignore[union-attr]
            except RingtrainError:
                self.release()
                raise
            for text in said:
                self.say(text)

    def note_loss(self, loss: torch.Tensor) -> None:
        """``ring.backward``'s loss, before its window advances: recorded beside the checkpoints, and compared with
        the run before the restart's where this run resumed one (selfcheck.py)."""
        if self.losses is None:
            return
        if not self.losses.started:
            resumed = self.step.optimizer_steps if self._resumed_from else None
            # A loop without safe points of its own resumes inexactly, and was told so: no check to report.
            self.losses.start(resumed, self._comparable and self._safe_points > 0)
        self.losses.saw(self.step.optimizer_steps, self.step.micro, loss)

    def nothing_left(self, where: str) -> None:
        """A resumed run whose checkpoint is already at the end of its loop (a finished job run again)."""
        if not self._resumed_from or self._said_finished:
            return
        self._said_finished = True
        self.say(f"ringtrain: {self._resumed_from} is at the end of this run ({where}): nothing is left to train."
                 "\nHINT: to train further, raise the number of epochs or steps; to start afresh, Ring(resume='never') "
                 "or another checkpoint_dir.")

    def take_resume_epoch(self) -> int | None:
        epoch, self.resume_epoch = self.resume_epoch, None
        return epoch

    # --- the loop's safe points -----------------------------------------------------------
    def safe_point(self, late: bool = False) -> None:
        """The loop is between two steps, where a resumed run continues: the top of a ``ring.steps`` or
        ``ring.epochs`` iteration, a ring loader about to fetch a batch, ``ring.close``. A resumed run's random
        state is put back here (not when the checkpoint was read: code between ``ring.setup`` and the loop may
        draw random numbers), and a due periodic save is written here, so that a resumed run repeats exactly
        what the loop does after it. ``late``: the first ``ring.backward`` after a step in a loop that has no
        safe point of its own (its batches are not a ring loader's, and it is not ``ring.steps``)."""
        if self._pending_rng is not None:
            rng.restore_rng(self._pending_rng)
            self._pending_rng = None
        if not late:
            self._safe_points += 1
        if self.step.save_every and self.step.backwards and not self.held.optimizers:
            raise RingtrainError(
                f"Ring(save_every={self.step.save_every}) saves every {self.step.save_every} optimizer steps, but "
                f"ring.setup was given no optimizer: ring.backward ran {self.step.backwards} time(s) and ringtrain saw "
                "no step, so no periodic checkpoint would ever be written",
                "give the optimizer to ring.setup and step that one: `model, optimizer = ring.setup(model, "
                "optimizer)`.")
        preemption = self.held.preemption
        # Every rank asks at every safe point but a late one (the agreement is a collective); it acts between
        # windows only, so the checkpoint holds no half-accumulated step.
        if preemption is not None and not late and preemption.due(self.strategy.world_size) and self.step.micro == 0:
            self._preempted(preemption)
        if not self.step.save_due:
            return
        if late and not self._said_late:
            self._said_late = True
            self.say(f"ringtrain: the periodic checkpoint of step {self.step.optimizer_steps} is written at the next "
                     "ring.backward: this loop has no safe point between its steps (its batches are not a ring "
                     "loader's, and it is not ring.steps), so a resumed run restarts "
                     + (f"epoch {self.held.epoch}" if self.held.epoch is not None else "the loop")
                     + " with that step's weights and does not repeat what came between the step and this backward "
                     "exactly.\nHINT: loop with `for step in ring.steps(max_steps)`, or draw the batches with "
                     "ring.loader, for exact resumes.")
        if self.held.nonfinite is not None:
            self.held.nonfinite.check(force=True)  # never save the state a NaN step produced
        self.autosave()

    def _preempted(self, preemption: Any) -> None:
        """Every rank, at the same step: that step's checkpoint on disk (unless it is there already), then exit."""
        started = time.monotonic()
        number = self.step.optimizer_steps
        path = self.checkpoints.path_for(number, folder=self.strategy.shards_state)  # type: ignore[union-attr]
        if self.checkpoints.latest() != path:  # type: ignore[union-attr]
            if self.held.nonfinite is not None:
                self.held.nonfinite.check(force=True)  # never save the state a NaN step produced
            self.autosave(seconds_from=started)
        self.flush()
        took = time.monotonic() - started
        name = signal.Signals(preemption.requested).name if preemption.requested else "a peer's signal"
        said = (f"ringtrain: preempted ({name}) at step {number}: checkpoint {path} written in {took:.1f} s; exit "
                f"{EXIT_CODE}: run the same command to resume from it")
        self.say(said)
        mark(self.strategy.rank, number, preemption.marks)  # for this node's ringtrain run: it exits 75 when its workers did
        self.strategy.finish(f"{PREEMPTED}{number}")  # the peers read a preemption, not a failure
        if self.is_main and preemption.requeue:
            self.say(requeue(preemption.slurm_job))
        raise Preempted(said)

    # --- 3: periodic saves ----------------------------------------------------------------
    def autosave(self, seconds_from: float | None = None) -> None:
        """Write the periodic checkpoint that is due: sharded and asynchronous where the strategy shards.
        The manifest records how long it took (``seconds_from``: when the save began), which a preemption's
        grace is compared with."""
        self.step.saved()
        self.activity.enter("checkpoint")
        started = time.monotonic() if seconds_from is None else seconds_from
        number = self.step.optimizer_steps
        folders = self.strategy.shards_state
        path = self.checkpoints.path_for(number, folder=folders)  # type: ignore[union-attr]
        if not folders:
            self.save(path, full=True, **self._targets)  # ring.extras go in too (save adds them)
            epoch, took = self.held.epoch, round(time.monotonic() - started, 3)
            self._agree(lambda: self.checkpoints.commit(path, step=number, epoch=epoch, seconds=took))  # type: ignore[union-attr]
            self._say_if_slower_than_grace(took)
            return
        self.flush()  # one save in flight at a time: the next waits for the previous
        tensors, skeleton, kinds, meta = self._sharded_parts(self._with_extras(self._targets))
        staging = self._agree(lambda: sharded.staging_folder(path))
        epoch, folder = self.held.epoch, self.checkpoints

        def done() -> None:  # in the writer thread, once every rank's shards are on disk
            if self.is_main:
                sharded.finish(staging, path, skeleton, kinds, meta)
                took = round(time.monotonic() - started, 3)
                folder.commit(path, step=number, epoch=epoch, seconds=took)  # type: ignore[union-attr]

        if self._async is None:
            self._async = sharded.AsyncSave(self.strategy.checkpoint_group(), self.activity)
        self._async.start(staging, tensors, done, clean_up=self.is_main)

    def _say_if_slower_than_grace(self, took: float | None) -> None:
        """Once: a checkpoint that takes longer than a preemption leaves would be cut short by the SIGKILL."""
        preemption = self.held.preemption
        if preemption is None or took is None or took <= preemption.grace or self._said_grace:
            return
        self._said_grace = True
        self.say(f"ringtrain: warning: the last checkpoint took {took:.1f} s to write, longer than the {preemption.grace:g} s "
                 "a preemption leaves before SIGKILL (Ring(preempt_grace=...)): a preempted job would lose its last "
                 "steps.\nHINT: give the job a longer grace (Slurm: --signal=USR1@<seconds> with "
                 "Ring(preempt_signal='SIGUSR1'); Kubernetes: terminationGracePeriodSeconds), or save less (sharded "
                 "under FSDP, fewer extras).")
