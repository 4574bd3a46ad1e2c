"""A resumed run checks itself: the losses ``ring.backward`` saw, per step and per rank, beside the checkpoints.

ringtrain promises that a run resumed from a checkpoint is the run it continues. That holds for what ringtrain
sees (weights, optimizer, RNG, ring loaders, ``ring.keep``, ``ring.batches``) and fails silently for what it
does not: a batch the script drew before the checkpoint and trains after it, a loader object of the script's own,
random numbers from a generator of its own (two GPT scripts: 4.0e-4 and 7.1e-4 off, nothing said). No peer checks its
own resume. Here every rank appends ``step micro loss`` (the exact float, in hex) to
``<checkpoint_dir>/losses/rank-NNNNN.txt`` as it trains; a resumed run reads what the run before it recorded past
the checkpoint and compares its own losses as it reaches those steps. The first step after the checkpoint depends
on nothing but the checkpoint, the batch and the random state, so it must match exactly (on the CPU; within
``tolerance`` where kernels are not deterministic); later steps also carry the all-reduce's summation order
(3+ ranks, buckets rebuilt after a restart) and are compared loosely, for gross differences only. A difference
is reported once, on the rank that sees it, naming the step, both values and the likely causes with the fix.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import torch

from ..errors import RingtrainError
from ..parallel import contract

LATER_STEPS = 8  # steps after the first one also compared (loosely)
LATER_TOLERANCE = 1e-2  # relative: a different batch or data stream, not the last bits of a sum
FLUSH_EVERY = 32  # losses on a device are read in groups (reading each would stall its queue every step)


def check_folder() -> str | None:
    """``ringtrain run --check-resume``: the folder this attempt's rings save into, a checkpoint every step
    (launcher/check_resume.py sets it for the workers: contract.Settings.check_resume)."""
    return contract.read().check_resume


def read_record(path: str) -> dict[tuple[int, int], float]:
    """A rank's recorded losses by (step, micro-batch); the first of a repeated one (a window redone)."""
    found: dict[tuple[int, int], float] = {}
    with open(path, encoding="ascii", errors="replace") as f:
        for line in f:
            parsed = _parse(line)
            if parsed is not None:
                found.setdefault((parsed[0], parsed[1]), parsed[2])
    return found


def tolerance_of(value: Any, device: torch.device, deterministic: bool) -> float | None:
    """``Ring(resume_tolerance=...)``: ``"auto"`` — exact on the CPU or with deterministic kernels, 1e-4 relative on
    other devices —, a relative tolerance >= 0, or None (no check)."""
    if value is None:
        return None
    if value == "auto":
        return 0.0 if device.type == "cpu" or deterministic else 1e-4
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise RingtrainError(f"Ring got resume_tolerance={value!r}",
                             "give a relative tolerance >= 0 (0: bitwise), 'auto' (exact on the CPU, 1e-4 on a GPU), "
                             "or None to turn the resumed run's self-check off.")
    return float(value)


def _parse(line: str) -> tuple[int, int, float] | None:
    if not line.endswith("\n"):
        return None  # a line a full disk cut short: its digits may read as another number
    parts = line.split()
    if len(parts) != 3:
        return None
    try:
        return int(parts[0]), int(parts[1]), float.fromhex(parts[2])
    except ValueError:
        return None  # a line cut by a kill: the rest of the file is still read


class LossRecord:
    """One rank's record of its losses in a checkpoint folder, and the check of a resumed run against it."""

    def __init__(self, folder: str, rank: int, tolerance: float | None):
        self.path = os.path.join(folder, "losses", f"rank-{rank:05d}.txt")
        self.rank = rank
        self.tolerance = tolerance
        self.expected: dict[tuple[int, int], float] = {}
        self.first_step: int | None = None  # the step a resumed run continues at
        self.checked = 0
        self.reported = False
        self._fd: int | None = None
        self._pending: list[tuple[int, int, torch.Tensor]] = []
        self._started = False

    def start(self, resumed_step: int | None, comparable: bool) -> None:
        """The run begins training: from scratch (``resumed_step`` None: the record starts afresh) or from a
        checkpoint, whose later records become what to compare with (``comparable``: the same world size and
        configuration, so the same losses are due)."""
        self._started = True
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        kept: list[str] = []
        if resumed_step is not None and os.path.isfile(self.path):
            with open(self.path, encoding="ascii", errors="replace") as f:
                for line in f:
                    parsed = _parse(line)
                    if parsed is None:
                        continue
                    step, micro, value = parsed
                    if step < resumed_step:
                        kept.append(line)
                    elif comparable and step <= resumed_step + LATER_STEPS:
                        self.expected.setdefault((step, micro), value)
        self.first_step = resumed_step
        temporary = f"{self.path}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="ascii") as f:
            f.writelines(kept)
        os.replace(temporary, self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)

    @property
    def started(self) -> bool:
        return self._started

    def saw(self, step: int, micro: int, loss: torch.Tensor) -> None:
        """``ring.backward`` got ``loss`` at optimizer step ``step``, micro-batch ``micro`` of its window."""
        if self._fd is None or loss.numel() != 1:
            return
        if loss.device.type == "cpu":
            self._write([(step, micro, float(loss.detach()))])
            return
        self._pending.append((step, micro, loss.detach().reshape(())))
        if len(self._pending) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        read = torch.stack([t.float() for _, _, t in pending]).tolist()
        self._write([(s, m, v) for (s, m, _), v in zip(pending, read)])

    def _write(self, rows: list[tuple[int, int, float]]) -> None:
        try:
            os.write(self._fd, "".join(f"{s} {m} {float(v).hex()}\n" for s, m, v in rows).encode())  # type: ignore[arg-type]
        except OSError:
            self.close()  # a full disk stops the record, never the run
            return
        for step, micro, value in rows:
            self._compare(step, micro, value)

    def _compare(self, step: int, micro: int, value: float) -> None:
        if self.reported or not self.expected:
            return
        before = self.expected.pop((step, micro), None)
        if before is None:
            return
        first = step == self.first_step
        allowed = (self.tolerance or 0.0) if first else max(self.tolerance or 0.0, LATER_TOLERANCE)
        same = value == before or (math.isnan(value) and math.isnan(before))
        if same or (allowed > 0 and abs(value - before) <= allowed * max(abs(before), abs(value))):
            self.checked += 1
            if not self.expected and self.rank == 0:
                print(f"ringtrain: resume checked: rank 0's losses of the {self.checked} micro-batch(es) after the "
                      f"checkpoint of step {self.first_step} equal the run's before the restart", flush=True)
            return
        self.reported = True
        self.expected.clear()
        print(self.report(step, micro, value, before), file=sys.stderr, flush=True)

    def report(self, step: int, micro: int, now: float, before: float) -> str:
        where = f"step {step}" + (f", micro-batch {micro}" if micro else "")
        line = (f"ringtrain: warning: rank {self.rank}: this resumed run is not the run it continues: at {where} its "
                f"loss is {now!r}, where the run before the restart had {before!r} (recorded in {self.path})")
        if self.rank != 0:  # rank 0 says why when it parts too; a rank that parts alone still says what to do
            return (line + ".\nHINT: wrap a prefetching draw with ring.batches, hand a loader object of the script's "
                    "own to ring.keep (docs/exact-resume.md).")
        return line + (
            f". Resumed from the checkpoint of step {self.first_step}, it should repeat that run exactly; something "
            "the script holds was not in the checkpoint. Likely: a batch drawn before the checkpoint and trained after "
            "it (a prefetch: `X, Y = get_batch()` before the loop and after each forward); a data loader object of the "
            "script's own whose position is not saved; random numbers from a generator of the script's own, or drawn "
            "before ring.setup.\nHINT: wrap the draw once — `get_batch = ring.batches(get_batch)` —, hand a loader "
            "object with state_dict()/load_state_dict() to `ring.keep(loader)`, keep other per-rank values in "
            "ring.extras; `ringtrain run --check-resume STEP ...` shows whether the script resumes exactly. "
            "Nondeterministic GPU kernels: Ring(resume_tolerance=1e-3).")

    def close(self) -> None:
        if self._fd is not None:
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - a device already gone at exit: the record ends where it is
                pass
            fd, self._fd = self._fd, None
            os.close(fd)
