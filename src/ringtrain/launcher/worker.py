"""Worker entry point: what each process started by ``ringtrain run`` executes first.

torchrun's agent starts ``python -u <this file> MODE LOCAL_RANK_ARG TARGET [ARGS...]``
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
  (``TORCHELASTIC_ERROR_FILE``) and shows in the launcher's failure report. This is
  exactly what torchelastic's ``@record`` does (its docstring spells out the equivalent
  ``get_error_handler().initialize() / record_exception(e)``; see
  https://pytorch.org/docs/stable/elastic/errors.html), written out here so that torch is
  imported only if an exception happens: a script that sets ``CUDA_VISIBLE_DEVICES`` or
  ``OMP_NUM_THREADS`` before its own ``import torch`` must find torch not yet imported,
  as under ``python script.py``.

Run as a file, not ``-m ringtrain...``: that would import ringtrain (and whatever its
``__init__`` imports) into every worker before the user's code, and a script run with
``python script.py`` never has that.
"""

import faulthandler
import os
import runpy
import sys

MODES = ("path", "module")


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


def _recorded(mode: str, target: str, argv: list) -> None:
    # = torchelastic's @record: a native crash dumps every thread's stack (what the handler's
    # initialize() does), an exception is written to TORCHELASTIC_ERROR_FILE, then re-raised
    # so the process still prints it and exits 1. SystemExit/KeyboardInterrupt pass through.
    faulthandler.enable(all_threads=True)
    try:
        _run(mode, target, argv)
    except Exception as e:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(e)
        raise


def main(argv: list) -> None:
    if len(argv) < 3 or argv[0] not in MODES:
        # Only the launcher starts this file; a person who runs it by hand gets told how.
        sys.exit(
            "ringtrain/launcher/worker.py is started by `ringtrain run`, not by hand.\n"
            "HINT: run `ringtrain run --help`."
        )
    mode, local_rank_arg, target, *args = argv
    _recorded(mode, target, _argv_for(target, local_rank_arg, args))


if __name__ == "__main__":
    main(sys.argv[1:])
