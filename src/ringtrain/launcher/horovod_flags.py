"""horovodrun's flags on ``ringtrain run [--horovod]``: every option of horovodrun 0.28.1
(horovod/runner/launch.py ``parse_args``), each mapped, passed to the workers as the variable horovodrun
sets, or refused with a HINT.

* mapped: ``-np``, ``-H``/``-hostfile``, ``-p``/``-i`` (ssh), ``--gloo`` (what ringtrain always runs:
  torch.distributed's Gloo, or NCCL on GPUs), ``--tcp`` (``NCCL_IB_DISABLE=1``), ``--start-timeout`` (the
  rendezvous ``--timeout``), ``--network-interface(s)`` (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``),
  ``--timeline-filename`` (``--timeline``), ``--no-stall-check``/``--stall-check-warning-time-seconds``
  (``RINGTRAIN_STALL_WARNING``), ``--verbose`` (prints the plan), ``--disable-cache`` (nothing is cached),
  ``--reset-limit`` (``--max-restarts``) and the elastic ones (``discovery.py``);
* tuning and logging knobs of Horovod's C++ core (``--fusion-threshold-mb``, ``--autotune``, ...): the
  ``HOROVOD_*`` variable horovodrun would set (``config_parser.set_env_from_args``), for the script;
  ringtrain.horovod reads ``HOROVOD_FUSION_THRESHOLD``; the others change nothing in ringtrain and
  ``ringtrain run`` says so once (``HOROVOD_CYCLE_TIME`` among them: its gradients go out bucket by bucket as
  backward makes them, the first bucket cut at 1 MiB, comm/grad_sync.py, not every few milliseconds);
* refused (``REFUSED``): MPI and jsrun, their arguments, ``--output-filename``, ``--config-file``,
  ``--check-build``, ``--blacklist-cooldown-range``.

No torch import here.
"""

from __future__ import annotations

import argparse

from ..errors import RingtrainError
from ..parallel import contract
from .torchrun_flags import Flag

_SWITCH = {"action": "store_true", "default": None}
_INT = {"type": int, "metavar": "N"}

# horovodrun's option strings and dests, as launch.py declares them (the test's reference list).
ELASTIC = (
    Flag(("--min-np", "--min-num-proc"), "min_np", {**_INT, "help": "the fewest processes the job runs with "
         "(elastic; default -np)."}),
    Flag(("--max-np", "--max-num-proc"), "max_np", {**_INT, "help": "the most processes it starts (elastic)."}),
    Flag(("--slots-per-host",), "slots", {**_INT, "help": "slots of a discovered host that names none (1)."}),
    Flag(("--host-discovery-script",), "host_discovery_script",
         {"metavar": "SCRIPT", "help": "prints `host[:slots]` lines: the hosts of an elastic job (see \"Horovod "
          "scripts\")."}),
    Flag(("--elastic-timeout",), "elastic_timeout", {**_INT, "help": "seconds nodes wait to re-form the job after "
         "a change (the c10d rendezvous' join_timeout; 600)."}),
    Flag(("--reset-limit",), "reset_limit", {**_INT, "help": "how often the job may restart (= --max-restarts)."}),
)

MAPPED = (
    Flag(("--gloo",), "use_gloo", {**_SWITCH, "help": "Gloo: what ringtrain runs (NCCL for GPU tensors); accepted."}),
    Flag(("--tcp",), "tcp_flag", {**_SWITCH, "help": "TCP only: NCCL_IB_DISABLE=1 for the workers."}),
    Flag(("--start-timeout",), "start_timeout", {**_INT, "help": "seconds to start: the rendezvous --timeout."}),
    Flag(("--disable-cache",), "disable_cache", {**_SWITCH, "help": "accepted: ringtrain run caches no checks."}),
    Flag(("--network-interfaces",), "nics", {"metavar": "IF,IF", "help": "the interfaces Gloo and NCCL use "
         "(GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)."}),
    Flag(("--network-interface",), "nic", {"metavar": "IF", "action": "append",
                                           "help": "one interface; repeat it for more (horovodrun's older form)."}),
    Flag(("--verbose",), "verbose", {**_SWITCH, "help": "print what ringtrain starts, and with which variables."}),
    Flag(("--timeline-filename",), "timeline_filename",
         {"metavar": "FILE.json", "help": "= --timeline FILE.json (the merged trace's path)."}),
    Flag(("--no-stall-check",), "no_stall_check", {**_SWITCH, "help": "no stall reports (RINGTRAIN_STALL_WARNING=0)."}),
    Flag(("--stall-check",), "stall_check", {**_SWITCH, "help": "stall reports on (the default)."}),
    Flag(("--stall-check-warning-time-seconds",), "stall_warning",
         {**_INT, "help": "seconds before a stall is reported (RINGTRAIN_STALL_WARNING; 60)."}),
)

# Knobs of Horovod's C++ core: set as horovodrun sets them. (flag, dest, variable, value -> text, kwargs)
_TRUE = dict(_SWITCH)
USED_BY_RINGTRAIN = ("HOROVOD_FUSION_THRESHOLD",)


def _knob(strings, dest, variable, kwargs, convert=str):
    read = "ringtrain's Horovod reads it" if variable in USED_BY_RINGTRAIN else "for the script; ringtrain ignores it"
    return Flag(strings, dest, {**kwargs, "help": f"sets {variable}, as horovodrun does ({read})."}), variable, convert


KNOBS = (
    _knob(("--fusion-threshold-mb",), "fusion_threshold_mb", "HOROVOD_FUSION_THRESHOLD", _INT,
          lambda v: str(v * 1024 * 1024)),
    _knob(("--cycle-time-ms",), "cycle_time_ms", "HOROVOD_CYCLE_TIME", {"type": float, "metavar": "MS"}),
    _knob(("--cache-capacity",), "cache_capacity", "HOROVOD_CACHE_CAPACITY", _INT),
    _knob(("--hierarchical-allreduce",), "hierarchical_allreduce", "HOROVOD_HIERARCHICAL_ALLREDUCE", _TRUE, lambda v: "1"),
    _knob(("--no-hierarchical-allreduce",), "no_hierarchical_allreduce", "HOROVOD_HIERARCHICAL_ALLREDUCE", _TRUE, lambda v: "0"),
    _knob(("--hierarchical-allgather",), "hierarchical_allgather", "HOROVOD_HIERARCHICAL_ALLGATHER", _TRUE, lambda v: "1"),
    _knob(("--no-hierarchical-allgather",), "no_hierarchical_allgather", "HOROVOD_HIERARCHICAL_ALLGATHER", _TRUE, lambda v: "0"),
    _knob(("--torus-allreduce",), "torus_allreduce", "HOROVOD_TORUS_ALLREDUCE", _TRUE, lambda v: "1"),
    _knob(("--no-torus-allreduce",), "no_torus_allreduce", "HOROVOD_TORUS_ALLREDUCE", _TRUE, lambda v: "0"),
    _knob(("--autotune",), "autotune", "HOROVOD_AUTOTUNE", _TRUE, lambda v: "1"),
    _knob(("--no-autotune",), "no_autotune", "HOROVOD_AUTOTUNE", _TRUE, lambda v: "0"),
    _knob(("--autotune-log-file",), "autotune_log_file", "HOROVOD_AUTOTUNE_LOG", {"metavar": "FILE"}),
    _knob(("--autotune-warmup-samples",), "autotune_warmup_samples", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", _INT),
    _knob(("--autotune-steps-per-sample",), "autotune_steps_per_sample", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", _INT),
    _knob(("--autotune-bayes-opt-max-samples",), "autotune_bayes_opt_max_samples",
          "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", _INT),
    _knob(("--autotune-gaussian-process-noise",), "autotune_gaussian_process_noise",
          "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", {"type": float, "metavar": "X"}),
    _knob(("--timeline-mark-cycles",), "timeline_mark_cycles", "HOROVOD_TIMELINE_MARK_CYCLES", _TRUE, lambda v: "1"),
    _knob(("--no-timeline-mark-cycles",), "no_timeline_mark_cycles", "HOROVOD_TIMELINE_MARK_CYCLES", _TRUE, lambda v: "0"),
    _knob(("--stall-check-shutdown-time-seconds",), "stall_shutdown", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", _INT),
    _knob(("--mpi-threads-disable",), "mpi_threads_disable", "HOROVOD_MPI_THREADS_DISABLE", _TRUE, lambda v: "1"),
    _knob(("--no-mpi-threads-disable",), "no_mpi_threads_disable", "HOROVOD_MPI_THREADS_DISABLE", _TRUE, lambda v: "0"),
    _knob(("--num-nccl-streams",), "num_nccl_streams", "HOROVOD_NUM_NCCL_STREAMS", _INT),
    _knob(("--thread-affinity",), "thread_affinity", "HOROVOD_THREAD_AFFINITY", _INT),
    _knob(("--gloo-timeout-seconds",), "gloo_timeout_seconds", "HOROVOD_GLOO_TIMEOUT_SECONDS", _INT),
    _knob(("--log-level",), "log_level", "HOROVOD_LOG_LEVEL",
          {"choices": ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")}),
    _knob(("--log-with-timestamp",), "log_with_timestamp", "HOROVOD_LOG_HIDE_TIME", _TRUE, lambda v: "0"),
    _knob(("--log-without-timestamp",), "log_without_timestamp", "HOROVOD_LOG_HIDE_TIME", _TRUE, lambda v: "1"),
    _knob(("--log-hide-timestamp",), "log_hide_timestamp", "HOROVOD_LOG_HIDE_TIME", _TRUE, lambda v: "1"),
    _knob(("--no-log-hide-timestamp",), "no_log_hide_timestamp", "HOROVOD_LOG_HIDE_TIME", _TRUE, lambda v: "0"),
)

_LAUNCHER_HINT = "drop it: ringtrain run starts the processes itself (-H/--hostfile for several hosts)."
REFUSED = {
    "--mpi": "drop --mpi (or write --gloo): ringtrain runs Horovod scripts on torch.distributed (Gloo on CPUs, "
             "NCCL on GPUs), with no MPI.",
    "--jsrun": _LAUNCHER_HINT,
    "--mpi-args": "drop --mpi-args: there is no mpirun to pass them to.",
    "--binding-args": "drop --binding-args (mpirun's); bind workers to CPUs with --numa-binding instead.",
    "--output-filename": "use --log-dir DIR --tee 3 (each worker's stdout and stderr in files under DIR, and "
                         "here) or --redirects 3 (only in the files).",
    "--config-file": "give the settings as flags on the command line.",
    "-cb": "run `ringtrain env` to see what this machine has (torch, backends, GPUs).",
    "--blacklist-cooldown-range": "drop it: ringtrain does not blacklist hosts; a failed node stops the job and "
                                  "--reset-limit/--max-restarts restarts it.",
    "-prefix-timestamp": "drop it; prefix lines yourself, e.g. `ringtrain run ... 2>&1 | ts`.",
}
_REFUSED_FLAGS = (  # (strings, nargs, metavar) of every refused option, so argparse takes them (and values) in
    (("--mpi",), 0, None), (("--jsrun",), 0, None), (("--mpi-args",), 1, "ARGS"), (("--binding-args",), 1, "ARGS"),
    (("--output-filename",), 1, "DIR"), (("--config-file",), 1, "FILE"), (("-cb", "--check-build"), 0, None),
    (("--blacklist-cooldown-range",), 2, ("MIN", "MAX")),
    (("-prefix-timestamp", "--prefix-output-with-timestamp"), 0, None),
)

# The whole option list of horovodrun 0.28.1, for the abbreviations it accepts (prefixes.py) and the test.
HOROVODRUN_OPTIONS = (
    "-h", "--help", "-v", "--version", "-np", "--num-proc", "-cb", "--check-build", "--disable-cache",
    "--start-timeout", "--network-interfaces", "--network-interface", "--output-filename", "--verbose",
    "--config-file", "-p", "--ssh-port", "-i", "--ssh-identity-file", "--fusion-threshold-mb", "--cycle-time-ms",
    "--cache-capacity", "--hierarchical-allreduce", "--no-hierarchical-allreduce", "--hierarchical-allgather",
    "--no-hierarchical-allgather", "--torus-allreduce", "--no-torus-allreduce", "--autotune", "--no-autotune",
    "--autotune-log-file", "--autotune-warmup-samples", "--autotune-steps-per-sample",
    "--autotune-bayes-opt-max-samples", "--autotune-gaussian-process-noise", "--min-np", "--min-num-proc",
    "--max-np", "--max-num-proc", "--slots-per-host", "--elastic-timeout", "--reset-limit",
    "--blacklist-cooldown-range", "--timeline-filename", "--timeline-mark-cycles", "--no-timeline-mark-cycles",
    "--no-stall-check", "--stall-check", "--stall-check-warning-time-seconds", "--stall-check-shutdown-time-seconds",
    "--mpi-threads-disable", "--no-mpi-threads-disable", "--mpi-args", "--tcp", "--binding-args",
    "--num-nccl-streams", "--thread-affinity", "--gloo-timeout-seconds", "--log-level", "--log-with-timestamp",
    "--log-without-timestamp", "-prefix-timestamp", "--prefix-output-with-timestamp", "--log-hide-timestamp",
    "--no-log-hide-timestamp", "-H", "--hosts", "-hostfile", "--hostfile", "--host-discovery-script", "--gloo",
    "--mpi", "--jsrun",
)


class _Refuse(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        hint = REFUSED.get(option_string) or REFUSED[self.option_strings[0]]
        raise RingtrainError(f"horovodrun's {option_string} is not something ringtrain run can honour", hint)


def add_to(parser: argparse.ArgumentParser, add) -> list:
    """Add horovodrun's flags (``add`` for those with a spelling pair); returns the actions added directly."""
    group = parser.add_argument_group("horovodrun's elastic flags (see \"Horovod scripts\" below)")
    for flag in ELASTIC:
        add(group, flag)
    group = parser.add_argument_group("horovodrun's other flags")
    for flag in MAPPED:
        add(group, flag)
    direct = [group.add_argument("-v", "--version", action="version", version=_version(),
                                 help="print the version of ringtrain and of the horovod it stands in for.")]
    group = parser.add_argument_group("Horovod's tuning and logging knobs: the variables horovodrun sets")
    for flag, _, _ in KNOBS:
        add(group, flag)
    group = parser.add_argument_group("horovodrun's flags ringtrain refuses, each with a HINT")
    for strings, nargs, metavar in _REFUSED_FLAGS:
        direct.append(group.add_argument(*strings, action=_Refuse, nargs=nargs, metavar=metavar,
                                         help="refused: " + (REFUSED.get(strings[0]) or REFUSED[strings[-1]])))
    return direct


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        mine = version("ringtrain")
    except PackageNotFoundError:
        mine = "unknown"
    return f"ringtrain {mine}; its horovod: 0.28.1 (horovod.torch's API on torch.distributed)"


def environment(ns: argparse.Namespace) -> tuple[dict, list]:
    """The workers' variables the horovodrun flags set, and the flags that set one ringtrain does not read."""
    env, inert = {}, []
    for flag, variable, convert in KNOBS:
        value = getattr(ns, flag.dest, None)
        if value is not None:
            env[variable] = convert(value)
            if variable not in USED_BY_RINGTRAIN:
                inert.append(flag.strings[0])
    nics = [*(ns.nics.split(",") if getattr(ns, "nics", None) else []), *(getattr(ns, "nic", None) or [])]
    if nics:
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = ",".join(n.strip() for n in nics)
    if getattr(ns, "tcp_flag", None):
        env["NCCL_IB_DISABLE"] = "1"
    if getattr(ns, "no_stall_check", None):
        env.update(contract.to_environ(stall_warning=None))  # never
    elif getattr(ns, "stall_warning", None) is not None:
        env.update(contract.to_environ(stall_warning=ns.stall_warning))
    return env, inert


def apply(ns: argparse.Namespace) -> argparse.Namespace:
    """horovodrun's flags in ringtrain's terms (timeout, timeline, max-restarts); a new namespace."""
    ns = argparse.Namespace(**vars(ns))
    start = getattr(ns, "start_timeout", None)
    if start is not None:
        if getattr(ns, "timeout", None) not in (None, start):
            raise RingtrainError(f"--start-timeout {start} and --timeout {ns.timeout} disagree",
                                 "give one of them: both are how long the processes may take to meet.")
        ns.timeout = start
    timeline_file = getattr(ns, "timeline_filename", None)
    if timeline_file is not None:
        if getattr(ns, "timeline", None) not in (None, timeline_file):
            raise RingtrainError("--timeline-filename and --timeline name different places",
                                 "give one of them (--timeline-filename FILE.json is --timeline FILE.json).")
        ns.timeline = timeline_file
    elastic_timeout = getattr(ns, "elastic_timeout", None)
    if elastic_timeout is not None:  # the c10d rendezvous' wait for nodes; an explicit --rdzv-conf key wins
        ns.rdzv_conf = ",".join(filter(None, [f"join_timeout={elastic_timeout}", getattr(ns, "rdzv_conf", None)]))
    reset = getattr(ns, "reset_limit", None)
    if reset is not None:
        if ns.max_restarts not in (0, reset):
            raise RingtrainError(f"--reset-limit {reset} and --max-restarts {ns.max_restarts} disagree",
                                 "give one of them: both are how often the job may start again.")
        ns.max_restarts = reset
    return ns
