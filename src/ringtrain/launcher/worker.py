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
* when the script is over, the peers and the launcher are told how: an uncaught exception
  (or ``sys.exit(N)``, N > 0) is written to the error file the agent reads
  (``TORCHELASTIC_ERROR_FILE``, ringtrain/liveness/failures.py) and shows in the launcher's report;
  a script that used torch.distributed posts "failed" or "finished" on the job's liveness
  board (ringtrain/liveness/membership.py), so a peer still waiting for it stops in seconds and the
  report names the rank that caused it. Then Python's exit steps run (non-daemon threads,
  atexit handlers, bounded in time) and the process leaves with the script's exit status,
  without interpreter finalization (``finish`` says why).
* nothing of ringtrain that imports torch is loaded before the user's code: a script
  that sets ``CUDA_VISIBLE_DEVICES`` or ``OMP_NUM_THREADS`` before its own ``import torch``
  must find torch not yet imported, as under ``python script.py``.
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

Run as a file, not ``-m ringtrain...``: a script run with ``python script.py`` has no
package of ringtrain's imported before its own code, and neither does a worker.
"""

import atexit
import faulthandler
import os
import runpy
import signal
import socket
import sys
import threading
import time
import traceback

MODES = ("path", "module", "exec")  # exec: `ringtrain run --no-python PROGRAM` (torchrun's), run as it is
EXIT_BOUND_S = 10.0  # = ringtrain.liveness.membership.EXIT_BOUND_S (this file imports nothing of ringtrain up front)
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


def answer_sigusr1() -> None:
    """``kill -USR1 <worker>``: print this worker's stacks (every thread), go on. faulthandler's handler
    works even while the main thread is blocked in native code (a collective)."""
    from ringtrain.liveness import dump  # liveness: no torch (see the module's docstring)

    stacks = dump.stack_signal(_settings().preempt_signal)  # SIGUSR2 under --preempt-signal USR1
    if hasattr(signal, "SIGUSR1") and signal.getsignal(stacks) == signal.SIG_DFL:
        faulthandler.register(stacks, all_threads=True, chain=False)  # a handler the script sets wins


def observe_plain_script(poll_s: float = 1.0) -> None:
    """A script that uses torch.distributed without ringtrain's API still gets the stall report and stacks on
    request: once it has formed its process group (and no ring watches it), a watchdog thread that only
    observes — publishes where this rank is, answers stack requests, reports a stall — joins the board.
    Nothing is imported before the script imports torch itself."""

    def wait_and_watch() -> None:
        while True:
            time.sleep(poll_s)
            dist = sys.modules.get("torch.distributed")
            if dist is not None and getattr(dist, "is_initialized", lambda: False)():
                break
        time.sleep(2 * poll_s)  # a ring forms its group and then starts its own watchdog: let it
        # imported only now: the worker entry loads nothing of ringtrain before the user's script runs
        from ringtrain.liveness import membership as liveness, watchdog
        from ringtrain.parallel import environments

        if liveness.has_joined():
            return
        env = environments.detect()
        if env.world_size < 2:
            return
        settings = _settings()
        board = liveness.plain_board(env.master_addr, env.master_port, env.rank, env.world_size,
                                     f"{env.restart_count}-0", secret=settings.job_secret, agent=settings.agent_nonce)
        if board is None:
            return
        board.hello()
        dog = watchdog.Watchdog(board, backward_syncs=True, error_file=None, stall_warning=settings.stall_warning,
                                checks=watchdog.default_checks(stopping=False))
        dog.start()
        # The script's dist.destroy_process_group() ends the watch: its peers (and the store's host, rank 0's
        # process in an elastic job) are leaving, and a look at a store that is gone only makes torch's C++
        # client print its retries.
        while dist.is_initialized():
            time.sleep(0.1)
        dog.halt()

    threading.Thread(target=wait_and_watch, name="ringtrain-observer", daemon=True).start()


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


def exit_status(error: SystemExit) -> int:
    """The status ``sys.exit(code)`` gives, as Python computes it (a message is printed, status 1)."""
    code = error.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def native_dump_path(launcher_pid: int, rank: int | str) -> str:
    """Where faulthandler writes a worker's native crash (SIGABRT, SIGSEGV): read by the launcher's report
    (torchelastic removes its own per-worker folder before the report could read a file there)."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"ringtrain-native-{launcher_pid}-{rank}.txt")


def native_dump_file():
    """The open file for ``native_dump_path`` of this worker; stderr when it cannot be made (or no launcher)."""
    launcher = _settings().launcher_pid
    if not launcher or "RANK" not in os.environ:
        return sys.stderr
    try:
        return open(native_dump_path(launcher, os.environ["RANK"]), "w")  # noqa: SIM115 - open for life
    except OSError:
        return sys.stderr


def run_to_end(call) -> tuple[int, str, BaseException | None]:
    """Run ``call()`` (the user's code); return (exit status, how it ended, the exception that ended it). The status
    is -N for a process that is to end by signal N (Ctrl-C)."""
    # = torchelastic's @record: a native crash dumps every thread's stack (what the handler's
    # initialize() does); an exception is printed by sys.excepthook (so a ring's hook sees it).
    faulthandler.enable(file=native_dump_file(), all_threads=True)
    try:
        call()
    except SystemExit as e:
        status = exit_status(e)
        return status, (f"sys.exit({e.code!r})" if status else "process exit"), (e if status else None)
    except KeyboardInterrupt as e:
        # Ctrl-C (torchrun's agent passes its SIGINT on to every worker): one line per rank, not a traceback
        # through runpy and this file; the process still ends by SIGINT (finish), as Python's own handling would.
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not interrupt the exit path
        where = _where(e.__traceback__)
        print(f"ringtrain: rank {os.environ.get('RANK', '?')} interrupted (SIGINT){where}", file=sys.stderr, flush=True)
        return -signal.SIGINT, "interrupted (SIGINT)", None
    except BaseException as e:  # noqa: BLE001 - every failure is reported, then the process ends
        e.with_traceback(_user_frames(e.__traceback__))  # the printer reads e.__traceback__ too
        sys.excepthook(type(e), e, e.__traceback__)
        return 1, traceback.format_exception_only(type(e), e)[-1].strip()[:500], e
    return 0, "process exit", None


def _where(tb) -> str:
    """`` in train.py:42``: the innermost frame of the user's own code (not the launcher's, runpy's, a package's or
    ringtrain's own: "interrupted (SIGINT) in base.py:186" named a file of ringtrain's installed from a checkout)."""
    from ringtrain.liveness.activity import is_user_file  # at the exit only: nothing of ringtrain up front (run by path)

    found = ""
    for frame, line in traceback.walk_tb(_user_frames(tb)):
        if is_user_file(frame.f_code.co_filename):
            found = f" in {os.path.basename(frame.f_code.co_filename)}:{line}"
    return found


def _user_frames(tb):
    """The traceback from the user's code on: the launcher's frames and runpy's are not theirs."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith(here) or "runpy" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _tell_peers(status: int, reason: str, error: BaseException | None) -> dict | None:
    """Post how this rank left on the job's liveness board (only if the script used torch.distributed)."""
    if "torch.distributed" not in sys.modules:
        return None  # a script that never imported it never joined a group: nobody waits for it
    # imported only now: the worker entry loads nothing of ringtrain before the user's script runs
    from ringtrain.liveness import membership as liveness
    from ringtrain.parallel import environments

    env = environments.detect()
    settings = _settings()
    return liveness.leave_process(status, reason, (env.master_addr, env.master_port), env.rank, env.world_size,
                                  f"{env.restart_count}-0", error, secret=settings.job_secret,
                                  agent=settings.agent_nonce)


def _settings():
    """The launcher's settings (parallel/contract.py); the defaults where a variable is bad (a ring says so)."""
    # no torch: the launcher's contract
    from ringtrain.errors import RingtrainError
    from ringtrain.parallel import contract

    try:
        return contract.read()
    except RingtrainError:
        return contract.Settings()


def finish(status: int, reason: str, error: BaseException | None) -> None:
    """End the worker: tell the peers, record the failure, run the exit handlers, leave.

    The process leaves with ``os._exit`` after Python's own exit steps (waiting for non-daemon
    threads, then the atexit handlers) and a flush, skipping only interpreter finalization: there,
    torch's Gloo threads can still hold tensors that need the GIL while the interpreter is torn
    down, and a finished job died with SIGABRT ("terminate called without an active exception")
    in 4 of 20 runs under plain torchrun (torch 2.13). The exit status is the script's.
    """
    post = _tell_peers(status, reason, error)
    if error is not None:
        from ringtrain.liveness import failures  # the script has run: loading it now costs it nothing

        info = post.to_dict() if post is not None else {"time": time.time(), "cause": "own"}
        callstack = "".join(traceback.format_exception(type(error), error, _user_frames(error.__traceback__)))
        failures.write_error_file(os.environ.get("TORCHELASTIC_ERROR_FILE"), reason, callstack, info)
    # Python's own first exit step: the threading module's exit callbacks (concurrent.futures' pools stop their
    # workers there — torch.compile leaves one), then every non-daemon thread joined. Joining alone waited forever
    # for an idle pool's workers: a compiled job's ranks never exited.
    threading._shutdown()
    # The exit handlers may not wait on peers forever: past the bound, stacks are dumped and the process ends.
    faulthandler.dump_traceback_later(EXIT_BOUND_S, exit=True)
    atexit._run_exitfuncs()  # what interpreter exit would run (the stdlib's own name for it)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if status != 0:
        from ringtrain.liveness import failures  # the script has run: loading it now costs it nothing

        failures.stop_own_processes(_settings().run_id is not None)  # what the script started goes with it
    if status < 0:  # ended by a signal (-N, as subprocess says it): by that signal still, as Python would end
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        status = 128 - status
    os._exit(status)


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
    die_with_parent(int(launcher_pid))  # the agent (`ringtrain run`) started this process (kept across exec)
    from ringtrain.parallel import contract  # no torch: the launcher's settings, written as the contract says

    os.environ.update(contract.to_environ(launcher_pid=int(launcher_pid)))  # for native_dump_file (read here only)
    answer_sigusr1()
    observe_plain_script()
    if horovod:
        become_horovod_worker()
    argv = _argv_for(target, local_rank_arg, args)
    if mode == "exec":
        # Not Python: the program takes this process over; its exit status is the worker's, as under torchrun.
        sys.stdout.flush()
        os.execvp(target, argv)
    finish(*run_to_end(lambda: _run(mode, target, argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
