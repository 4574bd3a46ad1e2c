"""``launch(fn, nprocs)`` and ``spawn(fn, nprocs, args)``: N local processes from Python.

``spawn`` has ``torch.multiprocessing.spawn``'s contract — ``fn(i, *args)`` in process i —
for scripts written with ``mp.spawn(main_worker, nprocs=4, args=(4, args))``; ``launch``
calls ``fn(*args)`` in every process (notebooks, tests). Both are built on torch's
``start_processes`` and add what it leaves to the caller:

* each child gets torchrun's environment contract (RANK, LOCAL_RANK, WORLD_SIZE,
  LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) before ``fn`` runs, so
  ``ringtrain.Ring()`` needs no arguments and ``init_process_group("gloo")`` (``env://``)
  works, exactly as under ``ringtrain run``;
* ``launch``: the parent hosts the job's TCPStore on a free loopback port, as torchrun's
  agent does (``TORCHELASTIC_USE_AGENT_STORE=True`` tells the children to join it as
  clients): the store outlives every rank, so a rank that finishes first cannot pull it out
  from under the others. ``spawn``: no store of the parent's — scripts written for
  ``mp.spawn`` form their group themselves (``init_method='tcp://...'``, or ``env://`` with
  MASTER_ADDR/MASTER_PORT they set), and a client-only flag would leave their rank 0
  waiting for a server that never comes; ``MASTER_PORT`` is a free port then, and rank 0
  hosts the store there (``Ring()`` does so by itself);
* the ranks' return values come back, as a list indexed by rank;
* a failing rank is reported as soon as it fails, naming the rank that caused it (not one
  that merely stopped because of it) with its traceback; the others are stopped. A rank
  that finishes while another still waits for it is named too (liveness/membership.py);
* each child leaves like a ``ringtrain run`` worker (worker.py): exit handlers run, the
  process ends with its status, and interpreter finalization is skipped;
* children die with the parent (Linux, "spawn" and "fork"): a notebook kernel or test
  runner that is killed takes its ranks along (``worker.die_with_parent``: SIGKILL);
* Gloo listens on loopback only (``GLOO_SOCKET_IFNAME``, unless set);
* the ranks seal their posts on the job's board with a secret made here (or the caller's
  ``RINGTRAIN_JOB_SECRET``), handed over with ``fn`` and never on a command line (seal.py).

No time limit by default (training runs for hours); ``timeout=`` seconds sets one.

The default start method is "spawn" (safe with CUDA, what ``mp.spawn`` uses), except for
a function defined in an interactive session (``__main__`` has no file: Jupyter, IPython,
``python -c``), which "spawn" cannot re-import; "fork" is used then, as Accelerate's
``notebook_launcher`` does. Fork requires that CUDA is not initialized in the parent, and
a parent that already ran torch CPU kernels may leave OpenMP's thread pool in a state
forked children hang on (seen here); a ``timeout`` turns that into an error. Functions
imported from a module always use "spawn".
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import multiprocessing.connection
import os
import pickle
import sys
import tempfile
import time
from typing import Any, Callable, NamedTuple, Sequence

from ..errors import RingtrainError
from ..liveness import failures
from ..liveness.seal import new_secret
from ..parallel import contract
from .ports import LOOPBACK, bind_listener, keep_gloo_on_loopback, serve_store
from .report import first_cause
from .worker import die_with_parent, finish, run_to_end

_RESULT = "rank{}.pkl"
_ERROR = "rank{}.error.json"


def _default_start_method(fn: Callable) -> str:
    main = sys.modules.get("__main__")
    interactive = main is None or not getattr(main, "__file__", None)
    defined_there = getattr(fn, "__module__", None) == "__main__"
    if interactive and defined_there and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return "spawn"


def _child(local_rank: int, fn: Callable, args: Sequence, nprocs: int, port: int, results: str,
           parent: int | None, pass_index: bool, forked: bool, secret: str) -> None:
    """Runs in each child (called by torch's spawn wrapper); never returns: the child ends here."""
    if forked:
        # A forked child inherits the parent's atexit handlers (the parent's temporary folder's
        # cleanup among them: it deleted the other ranks' results). It leaves through finish(),
        # which runs the exit handlers: only those registered in the child may run.
        atexit._clear()
    if parent is not None:
        die_with_parent(parent)  # a killed notebook kernel or test runner takes its ranks along
    # One node: global rank == local rank. The same names and values torchrun sets.
    os.environ.update(
        RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs),
        GROUP_RANK="0", MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port),
        TORCHELASTIC_ERROR_FILE=os.path.join(results, _ERROR.format(local_rank)),
    )
    os.environ.update(contract.to_environ(job_secret=secret))  # the board's seal (seal.py)
    if not pass_index:  # launch(): the parent hosts the store (see the module docstring)
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    keep_gloo_on_loopback(os.environ)  # one machine: nothing needs to reach the ranks from outside
    value: list = []
    ended = run_to_end(lambda: value.append(fn(local_rank, *args) if pass_index else fn(*args)))
    if ended[0] == 0:
        path = os.path.join(results, _RESULT.format(local_rank))
        with open(path + ".tmp", "wb") as f:
            pickle.dump(value[0], f)
        os.replace(path + ".tmp", path)  # a rank killed mid-write leaves no half-written result
    finish(*ended)


def _stop(processes: list) -> list[int]:
    """Terminate, then kill, every child still alive; return the ranks that were alive."""
    alive = [rank for rank, p in enumerate(processes) if p.is_alive()]
    for rank in alive:
        processes[rank].terminate()
    deadline = time.monotonic() + 3.0
    for rank in alive:
        processes[rank].join(max(0.0, deadline - time.monotonic()))
        if processes[rank].is_alive():
            processes[rank].kill()  # SIGTERM can be stuck behind a handler or C++ code
            processes[rank].join()
    return alive


def _check(fn: Callable, nprocs: Any, start_method: str) -> None:
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise RingtrainError(
            f"launch(fn, nprocs={nprocs!r}): nprocs must be a positive integer",
            "pass the number of processes to start, e.g. launch(main, 2).",
        )
    if not callable(fn):
        raise RingtrainError(f"launch(fn={fn!r}): fn is not callable", "pass the function each rank runs.")
    if start_method not in multiprocessing.get_all_start_methods():
        raise RingtrainError(
            f"start_method={start_method!r} is not available here",
            f"use one of {multiprocessing.get_all_start_methods()}.",
        )
    main = sys.modules.get("__main__")
    if start_method != "fork" and getattr(fn, "__module__", None) == "__main__" and not getattr(main, "__file__", None):
        raise RingtrainError(
            f"{getattr(fn, '__qualname__', fn)} is defined in an interactive session, and "
            f"start_method={start_method!r} children start a fresh interpreter that cannot import it",
            "leave start_method unset (fork is used interactively), or move fn into a .py file and import it.",
        )
    script = _unreadable_main()
    if start_method in ("spawn", "forkserver") and script is not None:
        raise RingtrainError(
            f"this script was read from {script} (`python - <<EOF`?), and start_method={start_method!r} children "
            "start a fresh interpreter that re-runs the parent's script from its file: there is none to re-run",
            "a script on stdin cannot be re-run by the workers: save it to a file (train.py) and run "
            "`python train.py`.",
        )
    if start_method == "fork" and cuda_initialized():
        raise RingtrainError(
            "CUDA is already initialized in this process, and forked children cannot use it",
            "restart the notebook kernel and call launch() before touching the GPU in the "
            "parent (no .cuda() / torch.cuda calls at top level), or use start_method='spawn' "
            "with fn in an importable .py file.",
        )


def _unreadable_main() -> str | None:
    """The parent's ``__main__`` file when spawned children could not re-run it (``<stdin>``), else None.

    multiprocessing's "spawn" children import the parent's main module again: by name when it
    was run with ``-m``, else from ``__main__.__file__``. ``python - <<EOF`` sets that to
    ``<stdin>``, and every child died with FileNotFoundError before the function even ran.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or getattr(getattr(main, "__spec__", None), "name", None):
        return None  # interactive (no file: fork is used), or `python -m` (re-imported by name)
    start = multiprocessing.process.ORIGINAL_DIR  # where a relative path is resolved (multiprocessing/spawn.py)
    return None if os.path.isfile(os.path.join(start or "", path)) else path


def cuda_initialized() -> bool:
    """Has this process created a CUDA context? Asked with ``is_initialized()`` only:
    ``is_available()`` itself initializes the CUDA driver in this process (torch documents it;
    PYTORCH_NVML_BASED_CUDA_CHECK exists for that), after which forked children fail in
    set_device with "Cannot re-initialize CUDA in forked subprocess" — the check would cause
    the very failure it guards against. A process that never imported torch has no context."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def launch(
    fn: Callable[..., Any],
    nprocs: int,
    args: Sequence[Any] = (),
    *,
    start_method: str | None = None,
    master_port: int | None = None,
    timeout: float | None = None,
) -> list[Any]:
    """Run ``fn(*args)`` on ``nprocs`` local processes; return the ranks' return values, by rank.

    Each process sees RANK/LOCAL_RANK/WORLD_SIZE/... in ``os.environ`` (see the module
    docstring), so ``fn`` can build a ``ringtrain.Ring()`` or call ``init_process_group("gloo")``
    directly. ``fn``, ``args`` and the return values must be picklable; with the "spawn" start
    method ``fn`` must be importable (defined at the top level of a .py file, not in
    ``__main__`` of a notebook).

    Raises RingtrainError as soon as a rank fails (naming the rank that caused it, with its
    traceback; the other ranks are stopped), and when the job runs longer than ``timeout``
    seconds, if one is given (every rank is killed).
    """
    return _start(fn, nprocs, args, start_method, master_port, timeout, pass_index=False)


def spawn(fn: Callable[..., Any], nprocs: int = 1, args: Sequence[Any] = (), join: bool = True,
          daemon: bool = False, start_method: str = "spawn") -> list[Any]:
    """``torch.multiprocessing.spawn``'s contract: ``fn(i, *args)`` in process i of ``nprocs``.

    ``rt.spawn(main_worker, nprocs=4, args=(4, args))`` for a script written for ``mp.spawn``:
    inside, ``ringtrain.Ring()`` needs no arguments (the processes are a job, as under
    ``ringtrain run``), and a hand-written ``init_process_group(..., init_method=...,
    world_size=nprocs, rank=i)`` works as before. Returns the return values, by rank (``mp.spawn``
    returns None). Failures are reported as ``launch`` reports them.
    """
    if not join:
        raise RingtrainError("rt.spawn(..., join=False) was asked for",
                             "use join=True (the default): rt.spawn waits and returns the ranks' results.")
    if daemon:
        raise RingtrainError("rt.spawn(..., daemon=True) was asked for",
                             "leave daemon=False: ranks that start DataLoader workers must not be daemonic.")
    return _start(fn, nprocs, args, start_method, None, None, pass_index=True)


def _start(fn: Callable, nprocs: int, args: Sequence, start_method: str | None, master_port: int | None,
           timeout: float | None, *, pass_index: bool) -> list[Any]:
    import torch.multiprocessing as tmp

    method = start_method or _default_start_method(fn)
    _check(fn, nprocs, method)
    name = f"{'spawn' if pass_index else 'launch'}({getattr(fn, '__qualname__', repr(fn))}, nprocs={nprocs})"
    listener = bind_listener(LOOPBACK, master_port or 0)
    port = listener.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="ringtrain-launch-") as results:
        try:
            # Children first, store second: a forked child must not inherit the store's
            # server thread. Early clients wait in the listening socket's backlog.
            context = tmp.start_processes(
                # With "forkserver" the children's parent is the server, not this process.
                _child, args=(fn, tuple(args), nprocs, port, results,
                              None if method == "forkserver" else os.getpid(), pass_index, method == "fork",
                              contract.read().job_secret or new_secret()),
                nprocs=nprocs, join=False, start_method=method,
            )
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            listener.close()
            raise RingtrainError(
                f"{name} could not send fn to the child processes: {e}",
                "with start_method='spawn', fn and args must be picklable: define fn at the top "
                "level of an importable .py file (not inside another function or a notebook cell).",
            ) from e
        store = None
        try:
            if pass_index:
                listener.close()  # spawn(): rank 0 hosts the store on this port (see the module docstring)
            else:
                store = serve_store(listener, LOOPBACK, 300.0)
            _wait(context.processes, name, timeout, results)
        except BaseException:
            _stop(context.processes)  # KeyboardInterrupt in a notebook must not leave ranks behind
            raise
        finally:
            del store
        return [_load(results, rank) for rank in range(nprocs)]


def _wait(processes: list, name: str, timeout: float | None, results: str) -> None:
    """Until every rank has exited 0; raise at the first failure (or at the time limit)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    running = dict(enumerate(processes))
    while running:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        multiprocessing.connection.wait([p.sentinel for p in running.values()], timeout=left)
        for rank, p in list(running.items()):
            if p.exitcode is None:
                continue
            del running[rank]
            if p.exitcode != 0:
                print(f"ringtrain: {name}: rank {rank} {_how(p.exitcode)}; stopping the other ranks.",
                      file=sys.stderr, flush=True)
                stopped = _stop(processes)
                raise _failure(processes, name, results, stopped)
        if deadline is not None and running and time.monotonic() >= deadline:
            alive = _stop(processes)
            raise RingtrainError(
                f"{name} did not finish within timeout={timeout} s; killed rank(s) {alive} that were still running",
                "a rank is usually blocked in a collective that another rank never calls (or in "
                "init_process_group waiting for a rank that exited); if the job is just long, raise timeout=.",
            )


def _how(exitcode: int) -> str:
    if exitcode < 0:
        import signal

        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class _Failure(NamedTuple):
    """What torchelastic's ProcessFailure tells the report, for a child of ``launch``."""

    exitcode: int
    message: Any  # the error file's "message" dict, or None
    pid: int


def _failure(processes: list, name: str, results: str, stopped: Sequence[int] = ()) -> RingtrainError:
    """The error naming the rank that caused the failure (report.first_cause decides which).

    ``stopped``: the ranks this process terminated after the first failure. One that left no
    record was killed by us, not by its own fault: it is never the cause (a child that died of a
    Python error before it could record one was reported as "killed by SIGTERM" in its place).
    """
    failed = {}
    for rank, p in enumerate(processes):
        if p.exitcode in (0, None):
            continue
        path = os.path.join(results, _ERROR.format(rank))
        record = None
        if os.path.exists(path):
            with open(path) as f:
                record = json.load(f)["message"]
        if record is None and rank in stopped:
            continue
        failed[rank] = _Failure(p.exitcode, record, p.pid)
    first, failure, blame = first_cause(failed)
    info = failures.info_of(failure.message) or {}
    what = f"rank {first} (pid {failure.pid}) {_how(failure.exitcode)}"
    if blame is not None:
        what = f"{blame.describe()}, and {what}" + (f" in {info['during']}" if info.get("during") else "")
    if failure.message is not None:
        # A rank stopped by a peer: its one-line reason says it all; its own traceback is the engine's.
        detail = failure.message.get("message", "") if blame is not None else (
            failure.message["extraInfo"].get("py_callstack") or failure.message.get("message", ""))
        hint = (f"fix the exception in rank {first}'s traceback above; to debug, run the same fn with nprocs=1."
                if blame is None else "every rank must make the same collective calls until the end: look for a "
                "branch on the rank or per-rank data that lets one rank finish or stop early.")
        return RingtrainError(f"{name}: {what}; the other ranks were stopped.\n{detail.rstrip()}", hint)
    if failure.exitcode < 0:
        hint = "a signal is usually the OOM killer (check `dmesg`) or a crash in native code."
        return RingtrainError(f"{name}: {what} without a Python error; the other ranks were stopped", hint)
    # Exited by itself before fn could record anything: a Python error while the child started (its
    # traceback is on its stderr), or an exit from native code.
    hint = ("the child's stderr above says why: it could not start (it failed to import fn's module or "
            "unpickle args), or it exited from native code.")
    return RingtrainError(f"{name}: {what} before fn recorded any error; the other ranks were stopped", hint)


def _load(results: str, rank: int) -> Any:
    with open(os.path.join(results, _RESULT.format(rank)), "rb") as f:
        return pickle.load(f)
