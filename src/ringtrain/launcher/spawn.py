"""``launch(fn, nprocs)``: run ``fn`` on N local processes from Python (notebooks, tests).

Like ``torch.multiprocessing.spawn`` (and built on its ``start_processes``), plus what
that leaves to the caller:

* each child gets torchrun's environment contract (RANK, LOCAL_RANK, WORLD_SIZE,
  LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) before ``fn`` runs, so
  ``init_process_group("gloo")`` (``env://``) and ``ringtrain.environments.detect()``
  behave exactly as under ``ringtrain run``;
* the parent hosts the job's TCPStore on a free loopback port, as torchrun's agent does
  (``TORCHELASTIC_USE_AGENT_STORE=True`` tells the children to join it as clients). The
  store then outlives every rank, so a rank 0 that finishes first cannot pull the store
  out from under ranks still shutting down (the "Connection reset by peer" on exit seen
  when rank 0 hosts it);
* the ranks' return values come back, as a list indexed by rank;
* a failure names the rank and carries its traceback, and ``timeout`` bounds the whole
  job, so a hang fails instead of blocking a notebook or a CI run forever;
* children die with the parent (Linux, "spawn" and "fork"): a notebook kernel or test
  runner that is killed takes its ranks along instead of leaving them blocked in a
  collective (``worker.die_with_parent``: SIGKILL; the SIGINT torch's spawn wrapper asks
  for is never acted on by a rank waiting inside a collective);
* Gloo listens on loopback only (``GLOO_SOCKET_IFNAME``, unless set), as under
  ``ringtrain run`` on one machine.

The default start method is "spawn" (safe with CUDA, what ``mp.spawn`` uses), except for
a function defined in an interactive session (``__main__`` has no file: Jupyter, IPython,
``python -c``), which "spawn" cannot re-import; "fork" is used then, as Accelerate's
``notebook_launcher`` does. Fork requires that CUDA is not initialized in the parent, and
a parent that already ran torch CPU kernels may leave OpenMP's thread pool in a state
forked children hang on (seen here); the timeout turns that into an error. Functions
imported from a module always use "spawn".
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

from ..errors import RingtrainError
from .ports import LOOPBACK, bind_listener, keep_gloo_on_loopback, serve_store
from .worker import die_with_parent

_RESULT = "rank{}.pkl"


def _default_start_method(fn: Callable) -> str:
    main = sys.modules.get("__main__")
    interactive = main is None or not getattr(main, "__file__", None)
    defined_there = getattr(fn, "__module__", None) == "__main__"
    if interactive and defined_there and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return "spawn"


def _child(
    local_rank: int, fn: Callable, args: Sequence, nprocs: int, port: int, results: str, parent: int | None
) -> None:
    """Runs in each child (called by torch's spawn wrapper, which reports exceptions)."""
    if parent is not None:
        die_with_parent(parent)  # a killed notebook kernel or test runner takes its ranks along
    # One node: global rank == local rank. The same names and values torchrun sets.
    os.environ.update(
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(nprocs),
        LOCAL_WORLD_SIZE=str(nprocs),
        GROUP_RANK="0",
        MASTER_ADDR=LOOPBACK,
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",
    )
    keep_gloo_on_loopback(os.environ)  # one machine: nothing needs to reach the ranks from outside
    value = fn(*args)
    path = os.path.join(results, _RESULT.format(local_rank))
    with open(path + ".tmp", "wb") as f:
        pickle.dump(value, f)
    os.replace(path + ".tmp", path)  # a rank killed mid-write leaves no half-written result


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
    if start_method == "fork":
        import torch

        # is_initialized() only: is_available() itself initializes the CUDA driver in this
        # process (torch documents it; PYTORCH_NVML_BASED_CUDA_CHECK exists for that), after
        # which forked children fail in set_device with "Cannot re-initialize CUDA in forked
        # subprocess" — the check would cause the very failure it guards against.
        if torch.cuda.is_initialized():
            raise RingtrainError(
                "CUDA is already initialized in this process, and forked children cannot use it",
                "restart the notebook kernel and call launch() before touching the GPU in the "
                "parent (no .cuda() / torch.cuda calls at top level), or use start_method='spawn' "
                "with fn in an importable .py file.",
            )


def launch(
    fn: Callable[..., Any],
    nprocs: int,
    args: Sequence[Any] = (),
    *,
    start_method: str | None = None,
    master_port: int | None = None,
    timeout: float = 300,
) -> list[Any]:
    """Run ``fn(*args)`` on ``nprocs`` local processes; return the ranks' return values, by rank.

    Each process sees RANK/LOCAL_RANK/WORLD_SIZE/... in ``os.environ`` (see the module
    docstring), so ``fn`` can call ``init_process_group("gloo")`` or build a
    ``ringtrain.Ring()`` directly. ``fn``, ``args`` and the return values must be
    picklable; with the "spawn" start method ``fn`` must be importable (defined at the
    top level of a .py file, not in ``__main__`` of a notebook).

    Raises RingtrainError when a rank raises or dies (naming the rank, with its
    traceback; the other ranks are stopped), and when the job runs longer than
    ``timeout`` seconds (every rank is killed).
    """
    import torch.multiprocessing as tmp
    from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

    method = start_method or _default_start_method(fn)
    _check(fn, nprocs, method)
    name = getattr(fn, "__qualname__", repr(fn))
    listener = bind_listener(LOOPBACK, master_port or 0)
    port = listener.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="ringtrain-launch-") as results:
        try:
            # Children first, store second: a forked child must not inherit the store's
            # server thread. Early clients wait in the listening socket's backlog.
            context = tmp.start_processes(
                # With "forkserver" the children's parent is the server, not this process.
                _child, args=(fn, tuple(args), nprocs, port, results, None if method == "forkserver" else os.getpid()),
                nprocs=nprocs,
                join=False, start_method=method,
            )
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            listener.close()
            raise RingtrainError(
                f"launch could not send {name} to the child processes: {e}",
                "with start_method='spawn', fn and args must be picklable: define fn at the top "
                "level of an importable .py file (not inside another function or a notebook cell).",
            ) from e
        store = None
        try:
            store = serve_store(listener, LOOPBACK, timeout)
            deadline = time.monotonic() + timeout
            while not context.join(timeout=max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    alive = _stop(context.processes)
                    raise RingtrainError(
                        f"launch({name}, nprocs={nprocs}) did not finish within timeout={timeout} s; "
                        f"killed rank(s) {alive} that were still running",
                        "a rank is usually blocked in a collective that another rank never calls (or "
                        "in init_process_group waiting for a rank that exited); if the job is just "
                        "long, raise timeout=.",
                    )
        except ProcessRaisedException as e:
            # torch's join already stopped the other ranks; e.msg holds the child's traceback.
            raise RingtrainError(
                f"rank {e.error_index} (pid {e.error_pid}) of launch({name}, nprocs={nprocs}) "
                f"raised; the other ranks were stopped.{e.msg.rstrip()}",
                f"fix the exception in rank {e.error_index}'s traceback above; to debug, run "
                "the same fn with nprocs=1.",
            ) from e
        except ProcessExitedException as e:
            if e.signal_name:
                how, hint = f"was killed by {e.signal_name}", (
                    "a signal is usually the OOM killer (check `dmesg`) or a crash in native code.")
            else:
                how, hint = f"exited with code {e.exit_code}", (
                    "the child's stderr above says why: either fn called sys.exit/os._exit, or the "
                    "child could not start (it failed to import fn's module or unpickle args).")
            raise RingtrainError(
                f"rank {e.error_index} (pid {e.error_pid}) of launch({name}, nprocs={nprocs}) {how} "
                "without raising from fn; the other ranks were stopped",
                hint,
            ) from e
        except BaseException:
            _stop(context.processes)  # KeyboardInterrupt in a notebook must not leave ranks behind
            raise
        finally:
            del store
        return [_load(results, rank) for rank in range(nprocs)]


def _load(results: str, rank: int) -> Any:
    with open(os.path.join(results, _RESULT.format(rank)), "rb") as f:
        return pickle.load(f)
