"""A timeline of every rank: where each step goes, and each gradient bucket's all-reduce.

``Ring(timeline=DIR)``, ``ringtrain run --timeline DIR`` (``RINGTRAIN_TIMELINE=DIR`` for the workers)
and ``hvd.start_timeline(path)`` / ``HOROVOD_TIMELINE=path`` start one ``Recorder`` per process. It gets

* the main thread's phases from ``activity.Activity`` (``data``, ``forward``, ``backward``,
  ``optimizer``, ``checkpoint``, ``evaluation``) and the ring's collectives (``Activity.calling``);
  with no recorder, Activity's hot path pays one ``is None`` test;
* each gradient bucket's all-reduce, start and end: DDP's comm hook wrapped (``comm_hook``; the end
  is the hook's future completing, on whatever thread completes it), or the Horovod-style bucket's
  engine work (comm/grad_sync.py).

Events are Chrome trace "complete" events (``"ph": "X"``, microseconds), one process lane per rank
and a thread lane for its main thread, another for the gradient all-reduces; chrome://tracing and
https://ui.perfetto.dev open the file. Memory is bounded: the last ``KEEP_STEPS`` steps are kept.
Steps are the ring's optimizer steps (``Activity.step_ends``): each part carries every kept step's window and
times, and the run's totals (``StepTimes``), so the picture and ``ringtrain timeline`` say what the run's per-rank
table says.

Nothing waits on peers (docs/architecture.md, principle 11; a teardown barrier once turned every exception into
a 30-minute hang): each rank writes its own part, ``<name>.rank-<r>.json``, atomically, when it
closes (``ring.close()``, the end of ``with Ring(...)``, ``hvd.stop_timeline()``, interpreter exit,
or the watchdog stopping it). The rank that finds every part of its job on disk after writing its
own merges them into ``<name>.json`` and draws ``<name>.png`` (timeline_plot.py): the last rank to
finish always does, since every other part was on disk before its own (at interpreter exit, whose
time is bounded, it draws no picture). ``ringtrain run`` merges
after the job if nobody did (a rank that died writes no part: the merge names it), and
``ringtrain timeline DIR`` merges by hand.

Clock: ``time.time()`` on every thread and rank; processes on one host share it. Ranks on several
hosts are only as aligned as the hosts' clocks (NTP: typically within a millisecond), so read the
gap between two hosts' lanes with that in mind.
"""

from __future__ import annotations

import atexit
import functools
import glob
import json
import os
import re
import socket
import sys
import time
from collections import deque
from typing import Any, Callable

from ..errors import RingtrainError, missing_extra
from ..liveness.activity import Activity
from .plot import EXTRA as PLOT_EXTRA

KEEP_STEPS = 1000  # steps kept in memory (and in the part) per rank: the last ones
MAIN, GRADS = 0, 1  # thread lanes: the main thread; the gradient all-reduces
LANES = {MAIN: "main thread", GRADS: "gradient all-reduce"}
NAME = "timeline"  # <name>.json, <name>.png and <name>.rank-<r>.json in a timeline folder
_PART = re.compile(r"\.rank-(\d+)\.json$")


def _say(text: str) -> None:
    print(f"ringtrain: {text}", file=sys.stderr, flush=True)


def check_target(target: str, what: str = "timeline", create: bool = True) -> tuple[str, str]:
    """``DIR`` (a folder, made if missing) or ``FILE.json`` (Horovod's form: the merged file's path) ->
    (folder, name). Raises RingtrainError when it cannot hold the timeline: checked before any training."""
    path = os.path.abspath(os.path.expanduser(str(target)))
    folder, name = (os.path.dirname(path), os.path.basename(path)[:-5]) if path.endswith(".json") else (path, NAME)
    hint = f"give {what} a folder that you can write to (it is made if missing), e.g. {what}='runs/timeline'."
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise RingtrainError(f"{what} {target!r}: {folder} is a file, not a folder", hint)
    if not create:
        return folder, name
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise RingtrainError(f"{what} {target!r}: cannot make the folder {folder}: {e.strerror}", hint) from e
    if not os.access(folder, os.W_OK | os.X_OK):
        raise RingtrainError(f"{what} {target!r}: the folder {folder} is not writable", hint)
    return folder, name


def part_path(folder: str, name: str, rank: int) -> str:
    return os.path.join(folder, f"{name}.rank-{rank}.json")


def _write_json(path: str, data: Any) -> None:
    """Whole or not at all: a reader never sees half a file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    os.replace(tmp, path)


class Recorder:
    """One process's events, written to its part file at ``close()``. See the module docstring."""

    def __init__(self, folder: str, name: str, rank: int, world_size: int, job: str, *,
                 keep_steps: int = KEEP_STEPS, merge: bool = True, activity: Activity | None = None):
        self.folder, self.name, self.rank, self.world_size, self.job = folder, name, rank, world_size, job
        self.activity = activity  # whose phases it hears (it is that activity's recorder until closed)
        self.merge = merge
        self.steps: deque[list] = deque(maxlen=keep_steps)  # the events of finished steps
        self.current: list = []  # (name, category, lane, start s, end s, step, args): the step in progress
        # Per finished step, from the activity's StepTimes (the table's and ranks.csv's source): [step, start s,
        # end s, data ms, sync ms, step ms]. A ring's optimizer step ends a step (Activity.step_ends); a Horovod
        # script's optimizer span does where no ring reports (its steps then have no times).
        self.step_times: deque[list] = deque(maxlen=keep_steps)
        self.step = 0
        self.dropped = 0
        self._open: tuple[str, float] | None = None  # the main thread's phase and when it began
        self.closed = False
        atexit.register(self._at_exit)

    # --- from Activity, on the main thread ------------------------------------------------
    def enter(self, phase: str, now: float) -> None:
        self._close_phase(now)
        self._open = (phase, now)

    def leave(self, phase: str) -> None:
        self._close_phase(time.time())

    def step_done(self, data_ms: float, sync_ms: float, step_ms: float) -> None:
        """A ring's optimizer step ended the step (its StepTimes figures): the next events are the next step's."""
        end = time.time()
        self.step_times.append([self.step, end - step_ms / 1e3, end, data_ms, sync_ms, step_ms])
        self._next_step()

    def collective(self, what: str, started: float) -> None:
        self.current.append((what, "collective", MAIN, started, time.time(), self.step, None))

    def span(self, phase: str) -> "_Span":
        """``with recorder.span("optimizer"):`` where no ring layer says so (a Horovod script's optimizer);
        inside a phase already open (a ring's), nothing more is recorded."""
        return _Span(self, phase if self._open is None else None)

    def _close_phase(self, now: float) -> None:
        if self._open is not None:
            phase, since = self._open
            self.current.append((phase, "phase", MAIN, since, now, self.step, None))
            self._open = None

    def _next_step(self) -> None:
        if self.current:
            if len(self.steps) == self.steps.maxlen:
                self.dropped += 1
            self.steps.append(self.current)
        self.current = []
        self.step += 1

    # --- gradient buckets ---------------------------------------------------------------------
    def bucket(self, index: int, nbytes: int, started: float, hook: str) -> list:
        """Bucket ``index``'s all-reduce began at ``started``; ``ended(event)`` says when it ended."""
        event = [f"all-reduce bucket {index}", "allreduce", GRADS, started, None, self.step,
                 {"bucket": index, "bytes": nbytes, "hook": hook}]
        self.current.append(event)  # a list append: safe beside the engine's threads
        return event

    # --- writing ----------------------------------------------------------------------------
    def events(self) -> list:
        # an all-reduce still in flight (no end yet) is left out
        return [event for step in (*self.steps, self.current) for event in list(step) if event[4] is not None]

    def write(self) -> str:
        path = part_path(self.folder, self.name, self.rank)
        _write_json(path, {"format": "ringtrain-timeline-part/1", "rank": self.rank, "world_size": self.world_size,
                           "job": self.job, "host": socket.gethostname(), "pid": os.getpid(),
                           "dropped_steps": self.dropped, "events": self.events(),
                           "step_times": list(self.step_times),
                           "times": self.activity.times.summary() if self.activity is not None else {}})
        return path

    def _at_exit(self) -> None:
        # Exit paths are bounded in time (liveness.bound_exit): the trace, not the picture (matplotlib's
        # import alone can take seconds on a loaded machine); `ringtrain run` or `ringtrain timeline` draws it.
        self.close(png=False)

    def close(self, merge: bool | None = None, png: bool = True) -> None:
        """Stop recording, write this rank's part; merge if every part of the job is there. Never waits."""
        if self.closed:
            return
        self.closed = True
        if self.activity is not None and self.activity.recorder is self:
            self.activity.recorder = None
        atexit.unregister(self._at_exit)
        self._close_phase(time.time())
        try:
            self.write()
        except OSError as e:
            _say(f"rank {self.rank} could not write its timeline part to {self.folder}: {e}")
            return
        if self.merge if merge is None else merge:
            parts = read_parts(self.folder, self.name, job=self.job)
            if len(parts) >= self.world_size and all(r in parts for r in range(self.world_size)) and self._wrote_last():
                merge_parts(self.folder, self.name, parts, self.world_size, png=png)

    def _wrote_last(self) -> bool:
        """Of the ranks that find every part on disk, the one whose part was written last merges: they all see the
        same times, so exactly one does (two ranks finishing together once both merged, and both printed)."""
        try:
            stamps = [(os.stat(part_path(self.folder, self.name, r)).st_mtime_ns, r) for r in range(self.world_size)]
        except OSError:
            return False
        return max(stamps)[1] == self.rank


def ended(event: list, *_: Any) -> None:
    """A bucket's all-reduce (``Recorder.bucket``) is seen done, on any thread. Its end is the earliest
    time it was seen (a completion callback waits for the GIL; a wait that finds the work done comes late)."""
    now = time.time()
    if event[4] is None or now < event[4]:
        event[4] = now


class _Span:
    def __init__(self, recorder: Recorder, phase: str | None):
        self.recorder, self.phase = recorder, phase

    def __enter__(self) -> None:
        if self.phase is not None:
            self.recorder.enter(self.phase, time.time())

    def __exit__(self, *exc: Any) -> None:
        if self.phase is not None:
            self.recorder.leave(self.phase)
            if self.phase == "optimizer":  # no ring reports this script's steps: its optimizer step ends one
                self.recorder._next_step()


def start(target: str, rank: int, world_size: int, job: str, activity: Activity, **options: Any) -> Recorder:
    """Record ``activity``'s phases (and the collectives of whatever reports to it) into ``target`` (a folder,
    or Horovod's ``FILE.json``) from now on; returns the recorder."""
    folder, name = check_target(target)
    recorder = Recorder(folder, name, rank, world_size, job, activity=activity, **options)
    activity.recorder = recorder
    return recorder


def ring_target(folder: str | None) -> str | None:
    """A ring's timeline folder (``Ring(timeline=...)`` over ``RINGTRAIN_TIMELINE``, which ``ringtrain run
    --timeline`` sets: the launcher contract's ``override`` decided), checked before the group forms; None: off."""
    folder = folder or None
    if folder is not None:
        check_target(folder)
    return folder


def start_for_ring(folder: str | None, env: Any, activity: Activity) -> Recorder | None:
    """A ring's recorder of its ``activity``, or None: off, or one already records there."""
    if folder is None or activity.recorder is not None:
        return None
    return start(folder, env.rank, env.world_size, job_of(env), activity)


def close(recorder: Recorder | None) -> None:
    """Write this rank's part (merged by whoever finds every part there: no waiting)."""
    if recorder is not None:
        recorder.close()


def job_of(env: Any) -> str:
    """What the ranks of one job share (and a later job, usually not): which parts belong together."""
    if env.world_size <= 1:
        return f"single-{os.getpid()}-{time.time():.0f}"
    return f"{env.master_addr}:{env.master_port}/{env.restart_count}"


# --- DDP comm hooks ---------------------------------------------------------------------------
def wrap_comm_hook(hook: Callable, recorder: Recorder) -> Callable:
    """``hook`` (a DDP comm hook, ``(state, bucket) -> Future``) recording each bucket's all-reduce:
    from the call (compression included) to the future's completion, with the bucket's index and bytes."""
    name = getattr(hook, "__name__", type(hook).__name__)

    @functools.wraps(hook)
    def timed(state: Any, bucket: Any):
        started = time.time()
        future = hook(state, bucket)
        buffer = bucket.buffer()
        shown = getattr(state, "hook_name", name)  # ringtrain's compression hooks name themselves
        event = recorder.bucket(bucket.index(), buffer.numel() * buffer.element_size(), started, shown)

        def done(result: Any) -> Any:
            # In the chain DDP waits on, not a side callback: a side callback can run after DDP went on
            # (it waits for the GIL the main thread holds), which put bucket ends after backward's.
            ended(event)
            return result.value()

        return future.then(done)

    return timed


def comm_hook(hook: Callable | None, recorder: Recorder | None) -> Callable | None:
    """The hook DDP should register: ``hook`` itself when no timeline records (``recorder`` None); else ``hook``
    (or, for DDP's built-in all-reduce, torch's equivalent Python ``allreduce_hook``) recording each bucket."""
    if recorder is None:
        return hook
    if hook is None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = default_hooks.allreduce_hook
    return wrap_comm_hook(hook, recorder)


# --- merging ----------------------------------------------------------------------------------
def _valid_part(data: Any) -> bool:
    """A part is untrusted input (docs/architecture.md, principle 12): its shape is checked before it is used."""
    number = (int, float)
    return (isinstance(data, dict) and isinstance(data.get("rank"), int) and isinstance(data.get("events"), list)
            and all(isinstance(e, list) and len(e) == 7 and isinstance(e[0], str) and isinstance(e[2], int)
                    and isinstance(e[3], number) and isinstance(e[4], number) for e in data["events"])
            and isinstance(data.get("step_times", []), list)
            and all(isinstance(t, list) and len(t) == 6 and all(isinstance(v, number) for v in t)
                    for t in data.get("step_times", []))
            and isinstance(data.get("times", {}), dict)
            and all(isinstance(k, str) and isinstance(v, number) for k, v in data.get("times", {}).items()))


def read_parts(folder: str, name: str, job: str | None = None) -> dict[int, dict]:
    """The parts in ``folder`` by rank: of ``job``, or (None) of the newest job there."""
    found = []
    for path in glob.glob(os.path.join(glob.escape(folder), f"{glob.escape(name)}.rank-*.json")):
        if not _PART.search(path):
            continue
        try:
            with open(path) as f:
                data = json.load(f)
            if _valid_part(data):
                found.append((os.path.getmtime(path), data))
            else:
                _say(f"{path} is not a ringtrain timeline part; left out")
        except (OSError, ValueError) as e:
            _say(f"{path} could not be read ({e}); left out")
    if job is None and found:
        job = max(found, key=lambda item: item[0])[1].get("job")
    return {data["rank"]: data for _, data in sorted(found, key=lambda item: item[0]) if data.get("job") == job}


def chrome_trace(parts: dict[int, dict]) -> dict:
    """One Chrome trace: a process lane per rank (``rank R (host)``), thread lanes main / gradient all-reduce."""
    starts = [e[3] for part in parts.values() for e in part["events"]]
    base = min(starts) if starts else 0.0
    events: list[dict] = []
    for rank, part in sorted(parts.items()):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank} ({part.get('host')})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        for tid, lane in LANES.items():
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": lane}})
        for name, category, tid, start_s, end_s, step, args in part["events"]:
            events.append({"name": name, "cat": category, "ph": "X", "pid": rank, "tid": tid,
                           "ts": round((start_s - base) * 1e6, 3), "dur": round(max(end_s - start_s, 0.0) * 1e6, 3),
                           "args": {"step": step, **(args or {})}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "ringtrain", "clock": "time.time() of each host, from the first event",
                          "dropped_steps": {str(r): p.get("dropped_steps", 0) for r, p in parts.items()}}}


def merge_parts(folder: str, name: str, parts: dict[int, dict], world_size: int | None = None,
                png: bool = True) -> tuple[str, str | None]:
    """Write ``<name>.json`` (and ``<name>.png``) from ``parts``; say which ranks' parts were missing."""
    path = os.path.join(folder, f"{name}.json")
    _write_json(path, chrome_trace(parts))
    world = world_size or max((p.get("world_size") or 0 for p in parts.values()), default=0)
    missing = [r for r in range(world) if r not in parts]
    note = f" (no part from rank(s) {', '.join(map(str, missing))}: they did not close)" if missing else ""
    picture, lacking = None, picture_lacks(folder)
    if png and lacking is None:
        from .timeline_plot import timeline_png  # matplotlib, imported only now

        try:
            picture = timeline_png(parts, os.path.join(folder, f"{name}.png"))
        except RingtrainError as e:  # matplotlib is there but does not import: the trace stands alone
            lacking = str(e)
    # Not drawn at a bounded exit (png=False): under `ringtrain run` the launcher draws it next and says so, so a
    # hint to draw it by hand here contradicted the line after it.
    drawn = f", {picture}" if picture else f"; no picture: {lacking}" if lacking else ""
    _say(f"timeline of {len(parts)} rank(s) -> {path}{drawn}{note}")
    return path, picture


def picture_lacks(folder: str) -> str | None:
    """Why ``timeline.png`` cannot be drawn here (matplotlib is missing: the trace stands alone), with the HINT
    that brings it; None when it can."""
    lacking = missing_extra("matplotlib", PLOT_EXTRA, "timeline.png")
    if lacking is None:
        return None
    return f"{lacking.message}\nHINT: {lacking.hint.rstrip('.')}; then `ringtrain timeline {folder}` draws it."


def merge_target(target: str, png: bool = True) -> tuple[str, str | None] | None:
    """Merge the newest job's parts at ``target`` (a folder or ``FILE.json``); None when there are none."""
    folder, name = check_target(target, create=False)
    parts = read_parts(folder, name) if os.path.isdir(folder) else {}
    if not parts:
        return None
    return merge_parts(folder, name, parts, png=png)


def merge_after_job(target: str) -> None:
    """``ringtrain run``: the workers have ended; merge unless the last of them already did."""
    try:
        folder, name = check_target(target, create=False)
        parts = glob.glob(os.path.join(glob.escape(folder), f"{glob.escape(name)}.rank-*.json"))
        # The picture counts only where it can be drawn: without matplotlib the rank that merged said so once.
        kinds = ("json", "png") if picture_lacks(folder) is None else ("json",)
        merged = [os.path.join(folder, f"{name}.{kind}") for kind in kinds]
        if not parts:
            _say(f"no timeline part in {folder}: did the script train through a ring or hvd?")
        elif not all(map(os.path.exists, merged)) or min(map(os.path.getmtime, merged)) < max(map(os.path.getmtime, parts)):
            merge_target(target)
    except (RingtrainError, OSError) as e:
        _say(f"the timeline could not be merged: {e}")


def main(argv: list[str] | None = None) -> int:
    """``ringtrain timeline DIR|FILE.json``: merge the parts there into one trace and its picture."""
    import argparse

    from ..errors import HintingParser  # the command line only: a recording rank never parses one

    parser = HintingParser(prog="ringtrain timeline", description=main.__doc__.split(": ", 1)[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog="The folder given to `ringtrain run --timeline DIR` or Ring(timeline=DIR), or the "
                                  "file given to hvd.start_timeline / HOROVOD_TIMELINE. Writes timeline.json (open it "
                                  "in https://ui.perfetto.dev or chrome://tracing) and timeline.png beside the parts.")
    parser.add_argument("target", metavar="DIR|FILE.json")
    parser.add_argument("--no-png", action="store_true", help="write the trace only.")
    ns = parser.parse_args(argv)
    try:
        if merge_target(ns.target, png=not ns.no_png) is None:
            raise RingtrainError(f"no timeline part (<name>.rank-<r>.json) at {ns.target}",
                                 "give the folder of `ringtrain run --timeline DIR` / Ring(timeline=DIR).")
    except RingtrainError as e:
        print(f"ringtrain timeline: {e}", file=sys.stderr)
        return 2
    from .timeline_plot import format_summary  # the picture's numbers, as text (mean ms per step)

    print(format_summary(read_parts(*check_target(ns.target, create=False))))
    return 0
