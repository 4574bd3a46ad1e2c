"""What this process's main thread is doing, and where: written by the main thread, read by the watchdog.

The main thread only writes attributes (a phase name and a time, a counter): nothing on the hot
path touches the store or takes a lock. The watchdog thread reads them, and the main thread's
Python stack (``sys._current_frames``, documented for tools like this one), at most twice a second.
The Ring (or ``hvd.init()``'s process group) makes one and hands it to what reports to it: its loaders, its
optimizer, its checkpoints, ``ring.log``, the timeline, and the watchdog that reads it. Nothing here is global.

* ``phase`` — what ringtrain's layers say the loop is in: ``data`` (a ring loader fetching a
  batch), ``forward`` (the batch is out, before ``ring.backward``), ``backward``, ``optimizer``,
  ``checkpoint``, ``evaluation`` (an ``exact=True`` loader), ``collective`` (a ring collective); a checkpoint's
  phase lasts while the call that entered it runs (``checkpoint_call``: nothing leaves it when ring.save returns);
* ``current`` / ``calls`` — the ring collective the main thread is in (``all_reduce #8``) and how
  many it has issued (the sequence number mismatched collectives are told apart by);
* ``times`` — milliseconds per optimizer step (``StepTimes``): data wait, the synchronising part (backward and
  the optimizer step: where a rank waits for the others) and the whole step, rolling and over the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import sysconfig
import threading
import time
import traceback
from collections import deque
from types import CodeType, FrameType
from typing import Callable, Iterator

# The engine's modules: a main thread inside one of them is in a collective of torch.distributed's (a script's own
# dist.all_reduce, DDP's forward broadcast, FSDP's all-gathers, DCP's collectives). Told by module name, which
# is torch's API, not by file path.
_ENGINE = ("torch.distributed", "torch.nn.parallel.distributed")
_BACKWARD = ("torch.autograd",)  # DDP's gradient all-reduce runs inside autograd (backward_syncs)
# decorators around torch.distributed's functions (inner_func: torch.distributed.checkpoint's logger around load, save)
_WRAPPERS = ("wrapper", "inner", "_fn", "decorate_context", "inner_func")
_C10D = "torch.distributed.distributed_c10d"  # the engine's collective calls (dist.all_gather_object, dist.broadcast...)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # src/ringtrain
WINDOW = 50  # steps the rolling times cover


class StepTimes:
    """Milliseconds per optimizer step — waiting for the training loader (``data``), in the synchronising part
    (``sync``: backward and the optimizer step, where a rank waits for the others) and in the whole step — over
    the last ``WINDOW`` steps and over the whole run. The one source of every per-rank step figure: the table
    ``ringtrain run`` prints, ``ring.stats()``, ``ring.log``'s ranks.csv and the timeline.

    A step ends at its optimizer step (``end``): ``steps`` counts ``ring.optimizer_steps``, micro-batches of an
    accumulation window being one step. The next begins there, or — after a loader's pass ended (``pause``:
    an epoch's evaluation and checkpoint are no step's) — at the next training fetch (``begin``), or at the next
    backward in a loop without ring loaders.
    """

    def __init__(self) -> None:
        self.recent: dict[str, deque] = {k: deque(maxlen=WINDOW) for k in ("data", "sync", "step")}
        self.total: dict[str, float] = {"data": 0.0, "sync": 0.0, "step": 0.0}
        self.steps = 0
        self._data = self._sync = 0.0
        self._started: float | None = None  # perf_counter() when the step in progress began; None: between steps

    def begin(self, now: float) -> None:
        """A training loader is about to fetch a batch: a step begins, unless one is in progress."""
        if self._started is None:
            self._started, self._data, self._sync = now, 0.0, 0.0

    def add(self, what: str, seconds: float, now: float) -> None:
        """A timed block of ``seconds`` ended at ``now``; between steps, a synchronising one begins a step."""
        if self._started is None:
            if what != "sync":
                return
            self._started, self._data, self._sync = now - seconds, 0.0, 0.0
        if what == "data":
            self._data += seconds
        else:
            self._sync += seconds

    def end(self, now: float) -> tuple[float, float, float] | None:
        """The optimizer stepped: the step in progress is done; its (data, sync, step) ms. The next begins now."""
        if self._started is None:
            return None
        done = (self._data * 1e3, self._sync * 1e3, (now - self._started) * 1e3)
        for key, value in zip(("data", "sync", "step"), done):
            self.recent[key].append(value)
            self.total[key] += value
        self.steps += 1
        self._started, self._data, self._sync = now, 0.0, 0.0
        return done

    def pause(self) -> None:
        """A training loader's pass ended: what follows until the next step begins is no step's."""
        self._started, self._data, self._sync = None, 0.0, 0.0

    def summary(self) -> dict[str, float]:
        out = {k: (sum(v) / len(v) if v else 0.0) for k, v in self.recent.items()}
        out.update({f"total_{k}": v for k, v in self.total.items()}, steps=float(self.steps))
        return out


class Activity:
    """See the module docstring."""

    def __init__(self, sequence: Callable[[], int | None] | None = None) -> None:
        self.calls = 0
        self.current: str | None = None
        self.phase = ""
        self.phase_since = 0.0
        self.step = 0
        # Whether a ring's loop counts this rank's steps: its layers enter the phases (a ring loader, ring.backward,
        # the gated optimizer). False for Horovod's API and a plain script, whose steps are their own loop's.
        self.counts_steps = False
        self.epoch: int | None = None
        self.times = StepTimes()
        # True while the main thread waits for work of this rank's own that needs no peer (the end of a sharded
        # checkpoint: its metadata and the manifest): not a collective, however long it takes.
        self.alone = False
        # A timeline.Recorder while a timeline records (timeline.py): it hears every phase change.
        # None otherwise, and then the hot path pays one `is None` test per change.
        self.recorder = None
        # The checkpoint entered last: the code of the call that entered it (ring.save's, the periodic save's: a code
        # object keeps no frame alive) and how many collectives the job had issued then (engine_sequence). Read by
        # checkpoint_call: the phase says "checkpoint" long after ring.save returned; the stack says whether it runs.
        self.checkpoint_entry: tuple[CodeType, int | None] | None = None
        self._sequence = sequence or engine_sequence  # tests: their own count

    @contextlib.contextmanager
    def calling(self, what: str) -> Iterator[None]:
        self.calls += 1
        previous, self.current = self.current, f"{what} #{self.calls}"
        phase, since = self.phase, self.phase_since
        # Not enter(): a timeline shows the collective inside the phase it interrupts.
        self.phase, self.phase_since = "collective", time.time()
        started = self.phase_since
        try:
            yield
        finally:
            self.current = previous
            self.phase, self.phase_since = phase, since
            if self.recorder is not None:
                self.recorder.collective(what, started)

    @contextlib.contextmanager
    def working_alone(self) -> Iterator[None]:
        previous, self.alone = self.alone, True
        try:
            yield
        finally:
            self.alone = previous

    def enter(self, phase: str) -> None:
        self.phase, self.phase_since = phase, time.time()
        self.counts_steps = True
        if phase == "checkpoint":  # a save or a load begins (rare: the stack walk and the count cost nothing per step)
            caller = sys._getframe(1)
            outer = self.checkpoint_entry
            # A checkpoint inside one still running (the periodic save writes through ring.save's code) is that one.
            if outer is None or not _runs(outer[0], caller.f_back):
                self.checkpoint_entry = (caller.f_code, self._sequence())
        if self.recorder is not None:
            self.recorder.enter(phase, self.phase_since)

    @contextlib.contextmanager
    def timed(self, phase: str, what: str | None) -> Iterator[None]:
        """The block is ``phase`` and counts toward this step's ``what`` (``data`` or ``sync``; None: neither)."""
        self.enter(phase)
        start = time.perf_counter()
        try:
            yield
        finally:
            now = time.perf_counter()
            if what is not None:
                self.times.add(what, now - start, now)
            if self.recorder is not None:
                self.recorder.leave(phase)

    # --- step boundaries (StepTimes): a training loader, the gated optimizer ------------------------
    def step_begins(self) -> None:
        """A training loader is about to fetch a batch."""
        self.times.begin(time.perf_counter())

    def step_ends(self, optimizer_steps: int) -> None:
        """The optimizer took a real step (``optimizer_steps`` taken now): the step is done, here and on a timeline."""
        self.step, self.counts_steps = optimizer_steps, True
        done = self.times.end(time.perf_counter())
        if self.recorder is not None and done is not None:
            self.recorder.step_done(*done)

    def pass_ends(self) -> None:
        """A training loader's pass is over (its fetch found no batch)."""
        self.times.pause()


def main_frame():
    return sys._current_frames().get(threading.main_thread().ident)


# Code objects of ringtrain's own functions in which the main thread waits for other ranks (``waits_for_peers``),
# each with how it names what it waits for. A decorator's registry: static, filled at import, never changed after.
_WAITING: dict[CodeType, Callable[[FrameType], str]] = {}


def waits_for_peers(describe: Callable[[FrameType], str] | None = None):
    """Mark a function as one where the main thread waits for other ranks (a collective's ``wait``): the watchdog
    counts time in it as time in a collective. ``describe(frame)`` names what it waits for (default: its name).
    The mark is on the function itself: renaming or moving a file changes nothing the watchdog concludes."""

    def mark(fn):
        _WAITING[fn.__code__] = describe or (lambda frame, name=fn.__qualname__: name)
        return fn

    return mark


PREEMPTION_MARK = "ringtrain_answers_preemption"  # on a signal handler that answers a preemption with a checkpoint


def answers_preemption(handler: Callable) -> Callable:
    """Mark a signal handler as one that answers a preemption with a checkpoint (loop/preempt.py's note), so that
    ``preemptible`` can tell, from the handler SIGTERM has now, whether this rank saves when it is preempted."""
    setattr(handler, PREEMPTION_MARK, True)
    return handler


def preemptible() -> bool:
    """Does this process answer SIGTERM with a checkpoint now (a ring with a ``checkpoint_dir``)? Read from the
    handler SIGTERM has (any thread may ask; a bound method reads its function's mark)."""
    try:
        return bool(getattr(signal.getsignal(signal.SIGTERM), PREEMPTION_MARK, False))
    except (ValueError, TypeError):
        return False


def engine_sequence() -> int | None:
    """How many collectives this process has issued on the job's default group (torch.distributed counts them,
    the same on every rank, in order), or None where there is no group. Read, never changed: a rank whose count
    moves is making progress, and a peer that finished with a count at least ours took part in our collective.
    torch.distributed is not imported here: only looked up where the script already imported it."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        # The process group's own counter (c10d's sequence number: what its flight recorder and desync debug read).
        return int(dist.distributed_c10d._get_default_group()._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - a backend without the counter, or a group being torn down
        return None


def _runs(code: CodeType, frame: FrameType | None) -> bool:
    """Is a call of ``code`` on the stack that ``frame`` is the innermost frame of?"""
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


# What the user called, by the name of the ringtrain function their line called, for the words of a message only
# (the watchdog's decisions never rest on it): a checkpoint reached from anything else is the loop's periodic one.
_CHECKPOINT_CALLS = {"save": "ring.save", "load": "ring.load"}


def checkpoint_call(activity: "Activity | None", frame: FrameType | None = None) -> tuple[str, int | None] | None:
    """The checkpoint the main thread is in now — ``ring.save``, ``ring.load`` or ``the periodic checkpoint`` — and
    how many collectives the job had issued when it began (``engine_sequence``); None outside one. The call that
    entered the phase must still be on the stack: once ring.save returned, the phase it left behind is stale."""
    entry = activity.checkpoint_entry if activity is not None else None
    if entry is None:
        return None
    frame = main_frame() if frame is None else frame
    while frame is not None and frame.f_code is not entry[0]:
        frame = frame.f_back
    if frame is None:
        return None
    called = frame.f_code.co_name
    while frame is not None and not is_user_file(frame.f_code.co_filename):  # out to the user's line that called it
        called, frame = frame.f_code.co_name, frame.f_back
    if frame is None:  # no frame of the user's to tell by: name both
        return "ring.save (or ring.load)", entry[1]
    return _CHECKPOINT_CALLS.get(called, "the periodic checkpoint"), entry[1]


def in_collective(activity: "Activity | None", frame: FrameType | None = None) -> bool:
    """Is the main thread inside a collective call, one that cannot return before its peers take part: a ring
    collective, or the engine's own call (the innermost of torch.distributed's frames is c10d's: dist.broadcast,
    dist.all_gather_object) — not the engine's local work in its other modules (a checkpoint's plan or reads, a state
    dict's copies), which looks the same to ``blocked_in``."""
    if activity is not None and activity.current is not None:
        return True
    frame = main_frame() if frame is None else frame
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("torch.distributed"):
            return module == _C10D
        frame = frame.f_back
    return False


def blocked_in(activity: "Activity | None", backward_syncs: bool, frame: FrameType | None = None) -> str | None:
    """What the main thread is blocked in, if it waits for other ranks; else None. Marked functions of ringtrain
    (``waits_for_peers``) and the engine's modules count; a DDP backward too when ``backward_syncs`` — unless the
    user's own code runs inside it (a backward hook, a custom Function's backward, a checkpointed forward computed
    again) and waits for nothing itself: that rank computes, it does not wait for its peers (a sleep in a hook was reported as the all-reduce, the peer blamed). The
    outermost such frame names it (the call the user made), unless a ring collective says what it is."""
    if activity is not None and activity.alone:
        return None
    frame = main_frame() if frame is None else frame
    found = None
    computing = False  # a frame of the user's code inside what was looked at so far, with no wait inside it
    while frame is not None:
        code = frame.f_code
        module = frame.f_globals.get("__name__", "")
        if code in _WAITING:
            try:
                found = _WAITING[code](frame)
            except Exception:  # noqa: BLE001 - a frame seen from another thread: describe as best we can
                found = code.co_name
        elif module.startswith(_ENGINE):
            if code.co_name not in _WRAPPERS:
                found = code.co_name  # keep the outermost: the call the user made
        elif backward_syncs and module.startswith(_BACKWARD):
            if computing and found is None:
                return None  # the user's code runs inside this backward: this rank computes its own part
            found = "backward (gradient all-reduce)"
        elif backward_syncs and found is None and not computing and is_user_file(code.co_filename):
            computing = True
        frame = frame.f_back
    if found is None:
        return None
    return (activity.current if activity is not None else None) or found


def in_backward(frame: FrameType | None = None) -> bool:
    """Is the main thread inside an autograd backward (its own computation, a hook of the user's...)?"""
    frame = main_frame() if frame is None else frame
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(_BACKWARD):
            return True
        frame = frame.f_back
    return False


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    here = _PACKAGE
    return tuple(os.path.realpath(d) + os.sep for d in (*dirs, here) if d)


_LIBRARIES = _library_dirs()


def is_user_file(filename: str) -> bool:
    """A file of the user's program: not Python's, not an installed package's, not ringtrain's."""
    if filename.startswith("<"):
        return False
    real = os.path.realpath(filename)
    return not real.startswith(_LIBRARIES)


def _shown(filename: str) -> str:
    """A path as a person reads it: relative to the current folder when it is under it."""
    relative = os.path.relpath(filename)
    return filename if relative.startswith("..") else relative


def user_site(frame=None) -> str | None:
    """``train.py:40 in main``: the innermost frame of the user's own code on the main thread's stack."""
    frame = frame if frame is not None else main_frame()
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            return f"{_shown(code.co_filename)}:{frame.f_lineno} in {code.co_name}"
        frame = frame.f_back
    return None


_WORKER = os.path.join(_PACKAGE, "launcher", "worker.py")


def _is_machinery(entry: str) -> bool:
    """A stack entry of what runs the user's script (ringtrain's worker entry, runpy): not theirs to read."""
    head = entry.lstrip().split("\n", 1)[0]
    return head.startswith((f'File "{_WORKER}"', 'File "<frozen runpy>"')) or f"{os.sep}runpy.py\"" in head


def format_stacks(all_threads: bool = False, limit: int = 40) -> str:
    """The main thread's Python stack (or every thread's), most recent call last, as a traceback shows it."""
    frames = sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    me = threading.get_ident()  # the thread asking (the watchdog): not what anyone wants to see
    idents = [main] + ([i for i in frames if i not in (main, me)] if all_threads else [])
    parts = []
    for ident in idents:
        frame = frames.get(ident)
        if frame is None:
            continue
        thread = threads.get(ident)
        name = thread.name if thread is not None else f"thread {ident}"
        lines = [entry for entry in traceback.format_stack(frame) if not _is_machinery(entry)][-limit:]
        parts.append(f"Thread {name!r} (most recent call last):\n" + "".join(lines).rstrip())
    return "\n".join(parts)
