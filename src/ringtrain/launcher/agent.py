"""The job, run through torchrun's elastic agent in this process (``torch.distributed.run``): the command line
torchrun's own parser gets from a ``Plan``, the store node 0 hosts, the board's seal, ``ringtrain stacks``'
signal, and what the job's end says (the failure report, the run summary, the merged timeline).

torch is imported inside the functions, not at the top: ``ringtrain run --help`` and argument errors answer
before torch loads.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time

from ..liveness import procs
from ..liveness.records import PREEMPTED_EXIT
from ..parallel import contract
from . import leftovers, preflight, torchrun_flags
from .plan import Plan
from .ports import TORCHRUN_DEFAULT_PORT, is_loopback

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")


def torchrun_argv(plan: Plan, port: int) -> list[str]:
    """The command line torchrun's own parser gets, so its defaults and checks all apply.

    It ends with the worker entry point only: the script's arguments never go through
    torchrun's parser (see ``torchrun_args``).
    """
    # rendezvous and waiting import torch (their backends subclass torch's): only once a job starts
    from .rendezvous import BACKEND
    from .waiting import ELASTIC

    argv = ["--nnodes", plan.nnodes, "--nproc-per-node", plan.nproc, "--max-restarts", str(plan.max_restarts)]
    bare = plan.master_addr.strip("[]")
    host = f"[{bare}]" if ":" in bare else bare  # an IPv6 address goes in brackets
    if plan.elastic:
        # Membership by rendezvous (torch/distributed/run.py, "Elastic"); torch's c10d backend is
        # wrapped so that it says what it waits for (waiting.py). Once MIN nodes are in, c10d
        # waits last_call_timeout (30 s by default) for more; keep that inside --timeout or every join
        # would time out. The user's --rdzv-conf wins.
        last_call = min(30, max(1, plan.timeout // 2))
        conf = {"join_timeout": plan.timeout, "last_call_timeout": last_call, **plan.rdzv_conf}
        backend = plan.rdzv_backend or "c10d"
        argv += ["--rdzv-backend", ELASTIC if backend == "c10d" else backend, "--rdzv-endpoint", f"{host}:{port}",
                 "--rdzv-id", plan.rdzv_id or f"ringtrain-{port}"]
    else:
        # torchrun's static rendezvous (explicit node ranks, node 0 hosts the store, a bounded
        # wait for the other nodes), but with an empty store for each restart: rendezvous.py.
        conf = {"timeout": plan.timeout, **plan.rdzv_conf, "rank": plan.node_rank}
        argv += ["--rdzv-backend", BACKEND, "--rdzv-endpoint", f"{host}:{port}"]
        if plan.rdzv_id:
            argv += ["--rdzv-id", plan.rdzv_id]
    argv += ["--rdzv-conf", ",".join(f"{k}={v}" for k, v in conf.items())]
    if plan.log_dir:
        argv += ["--log-dir", plan.log_dir]
    argv += torchrun_flags.passthrough_argv(plan.torchrun)
    return argv + [WORKER]


def torchrun_args(plan: Plan, port: int):
    """torchrun's parsed arguments, with the worker's (and so the script's) arguments set directly.

    Letting torchrun's parser see the script's arguments breaks scripts: argparse resolves
    abbreviations of its own options even inside the REMAINDER that would swallow them,
    so a script option such as ``--log`` or ``--master`` stopped plain torchrun with
    "ambiguous option: --log could match --log-dir, --logs-specs" (argparse classifies
    every ``--x`` string before it assigns any to the REMAINDER).
    """
    import torch.distributed.run as torchrun

    args = torchrun.parse_args(torchrun_argv(plan, port))
    mode = "exec" if plan.no_python else "module" if plan.module else "path"
    # worker.py's arguments; this process (the agent) is the workers' parent.
    args.training_script_args = [*(["--horovod"] if plan.horovod else []), mode, plan.local_rank_arg or "none",
                                 str(os.getpid()), plan.target, *plan.target_args]
    return args


def _say_plan(plan: Plan, args, threads: tuple[int, str] | None) -> None:
    """horovodrun's --verbose: what starts, where the processes meet, the variables set for them."""
    rendezvous = f"{args.rdzv_backend} at {args.rdzv_endpoint} ({'elastic' if plan.elastic else 'fixed nodes'})"
    print(f"ringtrain run: node {plan.node_rank} of {plan.nnodes}, {plan.nproc} worker(s) running "
          f"{' '.join([plan.target, *plan.target_args])}; rendezvous {rendezvous}", file=sys.stderr)
    for key in sorted({**plan.environment, **contract.to_environ(timeline=plan.timeline)}):
        print(f"ringtrain run:   {key}={os.environ[key]}", file=sys.stderr)
    if threads is not None:
        print(f"ringtrain run:   OMP_NUM_THREADS={threads[0]} ({threads[1]}; set it yourself to choose)",
              file=sys.stderr)


def execute(plan: Plan) -> int:
    """Run the job through torchrun's agent in this process; return the exit code."""
    # what the job needs, loaded once it starts (fast --help)
    from ..liveness.seal import job_secret, new_nonce

    # The board's seal (seal.py): the workers inherit the job's secret through the environment only, and a nonce
    # drawn now, which their hellos carry: the hellos of this job's workers are the ones this agent reads the
    # board with (a job key derived from hellos copied from another job's store would let that job's posts in).
    given = contract.read()  # the user's secret (or its file), if any
    secret, unsealed = job_secret(plan.max_nodes > 1, given.job_secret, given.job_secret_file,
                                  loopback=is_loopback(plan.master_addr))
    if unsealed:
        print(unsealed, file=sys.stderr, flush=True)
    sealing = contract.to_environ(job_secret=secret, agent_nonce=new_nonce()) if secret is not None else {}
    with contract.exported(sealing):  # for the workers, and this agent's own reads of the board
        return _execute(plan)


def _say_when_signalled(marks: str, stops=None):
    """Before torchrun's agent passes a signal it got on to the workers, write ``contract.SIGNALLED`` into
    ``marks``: its workers then know a SIGTERM is a preemption to answer with a checkpoint, not one of the
    agent's own stops (a failure, a restart, a node joining), which end them at once. torchrun's handler is
    ``torch.distributed.elastic.multiprocessing.api._terminate_process_handler``, registered by name at every
    start of the workers; it is wrapped here (and put back by the function returned). A torch without it:
    nothing is wrapped, and workers under ringtrain run take a SIGTERM for a stop. ``stops`` (exits.Stops) notes
    when, and what state the workers were in then (for the report of a preemption that saved nothing)."""
    from torch.distributed.elastic.multiprocessing import api  # torch once a job starts (fast --help)

    original = getattr(api, "_terminate_process_handler", None)
    if original is None:
        return lambda: None

    def signalled(signum, frame):
        if stops is not None:
            stops.signalled()
        with open(os.path.join(marks, contract.SIGNALLED), "w") as f:
            f.write(str(signum))
        original(signum, frame)  # raises torchrun's SignalException: it passes the signal on and waits

    api._terminate_process_handler = signalled

    def restore() -> None:
        api._terminate_process_handler = original

    return restore


class _SaidBetter(logging.Filter):
    """torchelastic's lines about passing a signal on (Ctrl-C: one for the agent, one per worker) are said once by
    ringtrain run's last line ("stopped by SIGINT; all workers on this node were stopped"), and its ``E... api.py]
    failed (exitcode: 1) local_rank: 1 (pid: ...) of binary: ...`` by the report ("worker rank 1 failed first
    (local rank 1 on node 0, host H, pid P, exit code 1)"): left out, unless --verbose."""

    SAID = ("Received %s death signal, shutting down workers", "Sending process %s closing signal %s",
            "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s")
    LOGGERS = ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.multiprocessing.api")

    def __init__(self, quiet: bool = True):
        super().__init__()
        self.quiet = quiet

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.quiet or record.msg not in self.SAID

    def __enter__(self) -> "_SaidBetter":
        for name in self.LOGGERS:
            logging.getLogger(name).addFilter(self)
        return self

    def __exit__(self, *exc) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeFilter(self)


def _execute(plan: Plan) -> int:
    # torch is imported here, not at module level: `--help` and argument errors stay fast.
    import torch.distributed.run as torchrun
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    # ...and ringtrain's side of the job, which needs torch's store and agent
    from ..liveness.board import job_board
    from ..liveness.failures import stop_leftover_groups
    from . import exits, rendezvous, report, waiting
    from .ports import host_store, keep_gloo_on_loopback
    from .report import first_cause, format_child_failure, remove_native_dumps, run_summary
    from .stacks import StackRequests

    def board_of(store, master=None):  # the job's board, as the workers seal theirs
        return job_board(store, master, secret=settings.job_secret, agent=settings.agent_nonce)

    rendezvous.register()
    waiting.register_elastic()
    started = time.monotonic()
    if plan.max_nodes == 1 and not is_loopback(plan.master_addr):
        print(f"ringtrain run: warning: --master-addr {plan.master_addr} is not a loopback address: this one-node "
              "job's store (and Gloo) listen on every interface, where any machine that reaches them can read the "
              "job's keys and connect to its ranks.\nHINT: leave --master-addr out (127.0.0.1) unless another "
              "node must join; see docs/security.md.", file=sys.stderr, flush=True)

    store = None  # node 0's TCPStore, held open until the job ends
    port = plan.master_port
    if not plan.elastic and plan.node_rank == 0:
        # A single node with no port given gets a free one (port 0); several nodes default to
        # torchrun's 29500 so that every node computes the same port.
        wanted = port if port is not None else (0 if plan.max_nodes == 1 else TORCHRUN_DEFAULT_PORT)
        store, port = host_store(plan.master_addr, wanted, plan.timeout)
    elif port is None:
        port = TORCHRUN_DEFAULT_PORT
    # What the workers inherit from this process's environment beside torchrun's own variables (torchrun's agent
    # passes its environment on): set here, each before what reads it, and all put back when the job is over.
    workers = contextlib.ExitStack()
    variables: dict[str, str] = {}
    if plan.gpus is not None:
        variables["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, plan.gpus))
    if is_loopback(plan.master_addr):
        # Only this machine can reach a loopback master: every node is here (several with -H
        # localhost:1,127.0.0.1:1), so Gloo need not listen anywhere else (unless the user chose an interface).
        keep_gloo_on_loopback(collections.ChainMap(variables, os.environ))
    if plan.elastic and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in os.environ:
        # c10d's agent shares one TCPStore with the workers of every round, and restarted
        # workers read the dead round's keys (rendezvous.py; pytorch/pytorch#135712): with
        # sharing off, each round's workers get a store of their own on a new port.
        variables["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    variables.update(contract.to_environ(timeline=plan.timeline))  # a ring (or hvd.init) in each worker records there
    variables.update(plan.environment)  # the flags for the workers (--preempt-signal, horovodrun's), as variables
    workers.enter_context(contract.exported(variables))
    args = torchrun_args(plan, port)
    # The workers' CPU threads, when the user has not chosen: every rank on this machine shares its cores. Set
    # before torchrun's config_from_args, which would otherwise set 1 and print its four-line banner.
    threads = preflight.threads_per_worker(plan, torchrun.determine_local_world_size(args.nproc_per_node),
                                           os.environ)
    if threads is not None:
        workers.enter_context(contract.exported({"OMP_NUM_THREADS": str(threads[0])}))
    if plan.verbose:
        _say_plan(plan, args, threads)
    # kill -USR1 on this process (ringtrain stacks): every rank prints its stack (stacks.py).
    # What the workers read (--preempt-signal's, the job's secret, the agent's nonce): this agent reads the same.
    settings = contract.read()
    requests = StackRequests((plan.master_addr, port), store, settings)
    requests.install()
    # Where this node's workers say they saved a preemption checkpoint and left (loop/preempt.py): read once they
    # are gone, here, whatever became of the job's store.
    marks = tempfile.mkdtemp(prefix="ringtrain-preempted-")
    workers.enter_context(contract.exported(contract.to_environ(marks=marks)))
    # The signals the agent sends its workers itself, for the report: a SIGTERM it did not send came from outside.
    stops = exits.Stops(grace=args.shutdown_timeout)
    restore_stops = stops.watch()
    restore_handler = _say_when_signalled(marks, stops)
    # A daemon a rank starts (double fork) becomes this process's child, and is stopped when the job ends.
    adopted, before = leftovers.adopt_orphans(), set(procs.children(os.getpid()))
    try:
        # run(), not main(): main's @record would print torchelastic's own failure summary.
        with _SaidBetter(quiet=not plan.verbose):
            torchrun.run(args)
    except ChildFailedError as e:
        said = report.preempted(contract.marked(marks), e.failures)
        if said:  # every worker saved and exited 75 (loop/preempt.py): not a failure
            print(said, file=sys.stderr, flush=True)
            return PREEMPTED_EXIT
        # A worker killed by a signal had no say: what it started may live on (failures.py).
        stop_leftover_groups(failure.pid for failure in e.failures.values())
        # ...nor could it tell the ranks on other machines: this agent does (exits.py).
        silent = exits.unspoken(e.failures, first_cause(e.failures, stops)[0], stops)
        board = None
        if not plan.elastic:  # the last attempt's board: after a restart, in that restart's own store
            attempt_store, attempt_port = rendezvous.workers_store(store, port)
            if silent or attempt_store is not None:
                board = board_of(attempt_store, (plan.master_addr.strip("[]"), attempt_port))
                exits.tell_job(board, silent)
        print(format_child_failure(e, plan.node_rank, board if board is not None else board_of(store), stops,
                                   shown=lambda local_rank: report.stderr_shown(args, local_rank)),
              file=sys.stderr, flush=True)
        if store is not None and plan.max_nodes > 1:
            exits.hold_store(board, set(e.failures))
        return 1
    except SignalException as e:
        # torchelastic passed the signal on and waited (--shutdown-timeout) for the workers to leave.
        said = report.preempted(contract.marked(marks), signame=e.sigval.name)
        if said:
            print(said, file=sys.stderr, flush=True)
            return PREEMPTED_EXIT
        if e.sigval.name in ("SIGTERM", settings.preempt_signal):  # a preemption: did anything save?
            attempt = store if plan.elastic else rendezvous.workers_store(store, port)[0]
            unsaved = report.preemption_not_saved(contract.marked(marks), board_of(attempt), stops, e.sigval.name)
            if unsaved:
                print(unsaved, file=sys.stderr, flush=True)
                return 128 + int(e.sigval)
        print(f"ringtrain run: stopped by {e.sigval.name}; all workers on this node were stopped.", file=sys.stderr)
        return 128 + int(e.sigval)
    except (DistError, RendezvousError) as e:
        raise waiting.rendezvous_failure(
            node_rank=plan.node_rank, elastic=plan.elastic, nnodes=plan.nnodes, max_nodes=plan.max_nodes,
            master_addr=plan.master_addr, port=port, timeout=plan.timeout, error=e,
            seconds=time.monotonic() - started) from e
    finally:
        workers.close()  # this process's environment is the caller's again
        requests.uninstall()
        if adopted:
            leftovers.stop_leftovers(before, lambda line: print(f"ringtrain run: {line}", file=sys.stderr, flush=True))
        restore_handler()
        restore_stops()
        shutil.rmtree(marks, ignore_errors=True)
        remove_native_dumps()
        if plan.timeline is not None:
            from ..tracking.timeline import merge_after_job  # only a --timeline job needs it

            merge_after_job(plan.timeline)  # unless the last worker did; a rank that died has no part
    final_store = store if plan.elastic else rendezvous.workers_store(store, port)[0]  # after restarts, the last's
    summary = run_summary(board_of(final_store))
    if summary:
        print(summary, file=sys.stderr)
    del store
    return 0
