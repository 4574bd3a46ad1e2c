"""Worker entry point: what each process started by ``ringtrain run`` executes first.

torchrun's agent starts ``python -u <this file> [--horovod] MODE LOCAL_RANK_ARG LAUNCHER_PID TARGET [ARGS...]``
in every worker. This file then makes the interpreter look exactly as if the user had
typed ``python TARGET ARGS...`` (or ``python -m TARGET ARGS...``) and runs the target:

* ``sys.argv`` is ``[TARGET, ARGS...]``, with ``--local_rank=N`` / ``--local-rank=N``
  inserted after ``TARGET`` only when the launcher found that the script declares that
  spelling (see scripts.py for why). Like torch.distributed.launch did, the flag goes
  before the user's arguments, so a ``--`` or a REMAINDER argument cannot swallow it.
* ``sys.path[0]`` is the script's directory (``python script.py``) or the current
  directory (``python -m``), never this package's ``launch/`` directory, whose module
  names (run, cli, worker, ...) would shadow the user's.
* an uncaught exception's traceback is written to the error file the agent reads
  (``TORCHELASTIC_ERROR_FILE``) and shows in the launcher's failure report: the JSON that
  torchelastic's ``@record`` writes (``ErrorHandler.record_exception``, see
  https://pytorch.org/docs/stable/elastic/errors.html), but written atomically (a
  temporary file, then a rename). torch's handler opens the file, emptying it, before it
  writes; the agent stops every other worker with SIGTERM as soon as one fails and then
  parses their error files, so a worker stopped between the two left an empty file and
  the agent itself died with ``JSONDecodeError`` (seen here when a peer's death made a
  rank raise). Written out here, without torch: a script that sets
  ``CUDA_VISIBLE_DEVICES`` or ``OMP_NUM_THREADS`` before its own ``import torch`` must
  find torch not yet imported, as under ``python script.py``.
* with ``--horovod`` (``ringtrain run --horovod``), the script can ``import horovod.torch``
  and read Horovod's variables, as under ``horovodrun``: ringtrain's ``horovod`` alias
  package (``ringtrain/horovod/_alias``, which re-exports ``ringtrain.horovod``) goes first
  on ``sys.path`` after the script's directory and first on ``PYTHONPATH`` (for processes the
  script starts, e.g. DataLoader workers re-importing it), and ``HOROVOD_RANK``/``SIZE``,
  ``HOROVOD_LOCAL_RANK``/``LOCAL_SIZE``, ``HOROVOD_CROSS_RANK``/``CROSS_SIZE`` and
  ``HOROVOD_HOSTNAME`` are set from torchrun's variables. Nothing named ``horovod`` is
  installed: other processes on the machine never see it.
* the worker dies with the launcher: torchrun starts each worker in a session of its
  own, so if ``ringtrain run`` itself is killed (``kill -9``, the OOM killer) nothing
  would stop the workers, which keep their GPU memory and ports and wait forever in
  their next collective. On Linux the kernel is asked to SIGKILL the worker when its
  parent dies (``prctl(PR_SET_PDEATHSIG)``, prctl(2)).

Run as a file, not ``-m ringtrain...``: that would import ringtrain (and whatever its
``__init__`` imports) into every worker before the user's code, and a script run with
``python script.py`` never has that.
"""

import faulthandler
import json
import os
import runpy
import signal
import socket
import sys
import time
import traceback

MODES = ("path", "module")
HOROVOD_FLAG = "--horovod"
# ringtrain/horovod/_alias: holds a package named `horovod` that re-exports ringtrain.horovod.
HOROVOD_ALIAS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "horovod", "_alias")


def horovod_environment(environ) -> dict:
    """Horovod's per-process variables (what horovodrun sets), from torchrun's.

    Cross rank/size are the node rank and the number of nodes; with the same number of
    processes on every node that is what Horovod counts (the ranks sharing this local
    rank, one per node). With uneven nodes Horovod counts only the nodes that have this
    local rank; ``hvd.cross_rank()``/``hvd.cross_size()`` compute that themselves.
    """
    return {
        "HOROVOD_RANK": environ["RANK"],
        "HOROVOD_SIZE": environ["WORLD_SIZE"],
        "HOROVOD_LOCAL_RANK": environ["LOCAL_RANK"],
        "HOROVOD_LOCAL_SIZE": environ["LOCAL_WORLD_SIZE"],
        "HOROVOD_CROSS_RANK": environ["GROUP_RANK"],
        "HOROVOD_CROSS_SIZE": environ["GROUP_WORLD_SIZE"],
        "HOROVOD_HOSTNAME": socket.gethostname(),
    }


def become_horovod_worker() -> None:
    """Let the script ``import horovod.torch`` (ringtrain's) and find the HOROVOD_* variables."""
    os.environ.update(horovod_environment(os.environ))
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = HOROVOD_ALIAS + (os.pathsep + old if old else "")
    # As if PYTHONPATH had said so at startup: right after sys.path[0] (the script's
    # directory, set by _run), before the PYTHONPATH entries and site-packages.
    sys.path.insert(1, HOROVOD_ALIAS)


def die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel SIGKILL this process as soon as ``parent_pid`` (its parent) exits.

    SIGKILL, not SIGTERM: a worker blocked in a collective runs no Python signal handler.
    Elsewhere this does nothing.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return  # no libc prctl (e.g. an unusual libc): nothing to arm
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the request was in place: nobody is left to report to


def _argv_for(target: str, local_rank_arg: str, args: list) -> list:
    if local_rank_arg == "none":
        return [target, *args]
    return [target, f"{local_rank_arg}={os.environ['LOCAL_RANK']}", *args]


def _run(mode: str, target: str, argv: list) -> None:
    sys.argv = argv
    if mode == "module":
        # `python -m` puts the current directory first; alter_sys sets argv[0] to the
        # module's file and sys.modules["__main__"] to the module while it runs.
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        # `python script.py` puts the script's real directory first (symlinks resolved).
        sys.path[0] = os.path.dirname(os.path.realpath(target))
        runpy.run_path(target, run_name="__main__")


def record_exception(e: BaseException) -> None:
    """Write ``e`` and the traceback being handled where the agent looks, whole or not at all."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {  # the layout torchelastic's ProcessFailure parses
        "message": {
            "message": f"{type(e).__name__}: {e}",
            "extraInfo": {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))},
        }
    }
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError as error:
        print(f"ringtrain: could not write the error file {path}: {error}", file=sys.stderr)


def _recorded(mode: str, target: str, argv: list) -> None:
    # = torchelastic's @record: a native crash dumps every thread's stack (what the handler's
    # initialize() does), an exception is written to TORCHELASTIC_ERROR_FILE, then re-raised
    # so the process still prints it and exits 1. SystemExit/KeyboardInterrupt pass through.
    faulthandler.enable(all_threads=True)
    try:
        _run(mode, target, argv)
    except Exception as e:
        record_exception(e)
        raise


def main(argv: list) -> None:
    horovod = bool(argv) and argv[0] == HOROVOD_FLAG
    if horovod:
        argv = argv[1:]
    if len(argv) < 4 or argv[0] not in MODES or not argv[2].isdigit():
        # Only the launcher starts this file; a person who runs it by hand gets told how.
        sys.exit(
            "ringtrain/launcher/worker.py is started by `ringtrain run`, not by hand.\n"
            "HINT: run `ringtrain run --help`."
        )
    mode, local_rank_arg, launcher_pid, target, *args = argv
    die_with_parent(int(launcher_pid))  # the agent (`ringtrain run`) started this process
    if horovod:
        become_horovod_worker()
    _recorded(mode, target, _argv_for(target, local_rank_arg, args))


if __name__ == "__main__":
    main(sys.argv[1:])
