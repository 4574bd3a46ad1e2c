"""``RunLog``: one log for the whole job — what ``ring.log`` calls, and the run folder it writes.

Every rank takes part in the call's two small collectives (reduce.py: the names, then the values); only the main process writes. The
folder and its files are made at the first ``ring.log``: a script that never logs leaves nothing behind.

The folder (``Ring(log_dir=...)``; by default ``CHECKPOINT_DIR-log`` beside a ``checkpoint_dir``, so a
restarted job finds it again, else ``runs/<script>-<time>``):

* ``metrics.csv`` — ``step, time`` and one column per metric (always; table.py);
* ``ranks.csv`` — per logging interval and rank: steps, ms per step and its data / compute / wait parts
  (what ``ringtrain plot`` draws as ``ranks.png``);
* TensorBoard's event files (when ``tensorboard`` is installed), W&B's and MLflow's (when asked for).

Continuity after a kill: the Ring says which optimizer step the job continues from (``resume_from``:
after ``ring.setup`` resumed from a checkpoint, or ``ring.load``); rows past it, written by the run that
was cut off before its next checkpoint, are dropped when the folder is opened, and the job writes those
steps again. So the log's last step follows the checkpoint's: nothing twice, nothing missing.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Mapping

from tqdm import tqdm

from ..errors import RingtrainError
from ..liveness.activity import Activity
from . import adapter, reduce as reducing
from .table import Table


def default_folder(log_dir: str | None, checkpoint_dir: str | None) -> str:
    if log_dir:
        return os.fspath(log_dir)
    if checkpoint_dir:
        return os.fspath(checkpoint_dir).rstrip("/\\") + "-log"
    script = os.path.splitext(os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else ""))[0]
    return os.path.join("runs", f"{script or 'python'}-{time.strftime('%Y%m%d-%H%M%S')}")


class RunLog:
    """See the module docstring. ``log_with``: backends asked for besides metrics.csv (adapter.py)."""

    def __init__(self, log_dir: str | None = None, log_with: Any = (), checkpoint_dir: str | None = None,
                 activity: Activity | None = None):
        self.activity = Activity() if activity is None else activity  # the ring's: its step times
        self.backends = adapter.backends(log_with)  # a backend asked for but not installed is named now
        self.folder = default_folder(log_dir, checkpoint_dir)
        self.latest: dict[str, float] = {}  # the last values logged (the progress bar shows them)
        self._rewind: int | None = None  # set by resume_from, used once when the files open
        self._opened = False
        self._tables: dict[str, Table] = {}
        self._writers: list[adapter.Adapter] = []
        self._times = [0.0] * len(reducing.TIMES)  # this rank's step counters at the previous call

    def resume_from(self, step: int) -> None:
        """The job continues from optimizer step ``step``: what the log holds past it is superseded."""
        self._rewind = step
        if self._opened:  # ring.load after logging began: the files go back to that step now
            self.close()
            self._open()

    def log(self, values: Mapping[str, Any], step: int, reduce: str | None, strategy: Any) -> dict[str, float]:
        """Reduce ``values`` over the ranks (a names check, then one matrix), write them on the main process, return them."""
        reducing.check_reduce(reduce)
        names, raw = reducing.values_of(values)
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise RingtrainError(f"ring.log got step={step!r}", "give a step >= 0 (an int), or leave it out: "
                                 "the optimizer step count is the default.")
        times = self.activity.times
        now = [float(times.steps), times.total["data"], times.total["sync"], times.total["step"]]
        interval = [a - b for a, b in zip(now, self._times)]
        self._times = now
        reducing.agree(names, rank=strategy.rank, world_size=strategy.world_size, device=strategy.device,
                       all_reduce=lambda m: strategy.all_reduce(m, "sum"), gather_object=strategy.gather_object)
        matrix = reducing.gather(names, raw, interval, rank=strategy.rank, world_size=strategy.world_size,
                                 device=strategy.device, all_reduce=lambda m: strategy.all_reduce(m, "sum"))
        result = reducing.reduced(names, matrix, reduce)
        self.latest.update(result)
        if strategy.rank == 0:
            self._write(step, result, reducing.rank_rows(matrix))
        return result

    def _write(self, step: int, values: dict[str, float], ranks: list[dict[str, float]]) -> None:
        if not self._opened:
            self._open()
        wall = time.time()
        self._tables["metrics"].append({"step": step, "time": round(wall, 3), **values})
        for row in ranks:
            self._tables["ranks"].append({"step": step, **row})
        for writer in self._writers:
            writer.write(step, values, wall)

    def _open(self) -> None:
        rewind, self._rewind = self._rewind, None
        try:
            os.makedirs(self.folder, exist_ok=True)
            self._tables = {"metrics": Table(os.path.join(self.folder, "metrics.csv"), ("step", "time")),
                            "ranks": Table(os.path.join(self.folder, "ranks.csv"), ("step", "rank"))}
            dropped = [t.open(rewind) for t in self._tables.values()][0]
        except OSError as e:
            raise RingtrainError(f"cannot write the run log in {self.folder!r}: {e}",
                                 "give Ring(log_dir=...) a folder this process can write to.") from e
        self._writers = [adapter.make(name, self.folder, rewind) for name in self.backends]
        self._opened = True
        resumed = f"; continuing after step {rewind}" if rewind else ""
        gone = (f" ({dropped} row(s) the run before logged past that step dropped: those steps are trained again)"
                if dropped else "")
        # tqdm's write clears a progress bar (ring.progress) first and draws it again below: a plain print landed
        # inside the bar's line.
        tqdm.write(f"ringtrain: logging to {self.folder} (metrics.csv{''.join(', ' + b for b in self.backends)})"
                   f"{resumed}{gone}", file=sys.stderr)
        sys.stderr.flush()

    def close(self) -> None:
        """Put everything on disk; the log reopens (continuing the files) if ``ring.log`` is called again."""
        if not self._opened:
            return
        self._opened = False
        for closable in [*self._tables.values(), *self._writers]:
            closable.close()
        self._writers = []
