"""The launcher -> worker contract: every setting that crosses the process boundary as an environment variable.

``ringtrain run`` (and ``rt.launch``) start workers as torchrun does: a worker learns where it stands from the
environment it inherits. torchrun's own variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
...) and the schedulers' (``SLURM_*``, ``OMPI_*``) are read by the environment detectors
(``environments.py``); everything else a worker reads from its environment is here, in one place:

* ``Settings``: a frozen record of the values, typed and checked;
* ``read(environ)``: the one reader. A bad value is refused with the variable's name and value;
* ``to_environ(settings or fields)``: the one writer, the variables a launcher sets for its workers, and
  ``exported(variables)``: them set in this process while it starts the workers, put back afterwards;
* ``VARIABLES``: the table (name, field, type, default, meaning, who sets it), from which
  ``docs/environment.md`` is generated (contract_page.py);
* ``override(settings, **keywords)``: ``Ring(...)``'s keywords over the environment's values, in one place;
* the protocol's constants and checks both sides share: the preemption signal's and grace's checks, the marks
  folder's files (``mark``, ``marked``, ``SIGNALLED``).

Components never read the environment themselves: whoever builds them (the Ring, the process-group service,
``hvd.init()``, the launcher's agent) reads ``Settings`` once and hands each its values. This module imports no
torch: the launcher's worker entry reads it before the user's script imports torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, MutableMapping

from ..errors import RingtrainError
from ..liveness.watchdog import STALL_WARNING_S

# --- the protocol's constants (the launcher and the workers agree on them) ------------------------------------
DEFAULT_GRACE = 30.0  # torchelastic's shutdown wait, and Kubernetes' terminationGracePeriodSeconds default
DEBUG_COLLECTIVES_S = 60.0  # the collective checks' timeout when switched on without a number
SIGNALLED = "signalled"  # the file ringtrain run's agent writes in its marks folder when a signal reaches it

_NOT_PREEMPTION = tuple(getattr(signal, name) for name in ("SIGKILL", "SIGSTOP", "SIGINT", "SIGUSR2", "SIGCHLD")
                        if hasattr(signal, name))
_OFF = ("0", "off", "none", "never", "false", "no")
_ON = ("1", "on", "true", "yes")


# --- the values' checks (shared by the reader, the writer's callers and Ring's keywords) -----------------------
def signal_of(value: Any, what: str = "Ring(preempt_signal=...)") -> int | None:
    """A preemption signal: ``"SIGUSR1"``, ``"USR1"``, ``signal.SIGUSR1``, ``10``, or None (SIGTERM alone)."""
    if value is None:
        return None
    if isinstance(value, signal.Signals) or (isinstance(value, int) and not isinstance(value, bool)):
        return int(value)
    text = str(value).strip().upper()
    if text.isdigit():
        found: Any = next((s for s in signal.Signals if s.value == int(text)), None)
    else:
        found = getattr(signal, text if text.startswith("SIG") else f"SIG{text}", None)
    if not isinstance(found, signal.Signals) or found in _NOT_PREEMPTION:
        raise RingtrainError(f"{what} got {value!r}, which is not a signal a scheduler preempts with",
                             "give the signal the scheduler sends ahead of the end, e.g. SIGUSR1 (Slurm's "
                             "--signal=USR1@90); SIGTERM is always taken. Not SIGKILL/SIGSTOP (they cannot be "
                             "caught), SIGINT (Ctrl-C stops the job) or SIGUSR2 (the stack request's).")
    return int(found)


def signal_name(value: Any, what: str = "Ring(preempt_signal=...)") -> str | None:
    """``signal_of``, as the signal's name (``"SIGUSR1"``): how the setting is held and written."""
    number = signal_of(value, what)
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def check_grace(value: Any, what: str = "Ring(preempt_grace=...)") -> float:
    """The seconds a preemption leaves before SIGKILL: a positive number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise RingtrainError(f"{what} got {value!r}",
                             "give the seconds the scheduler leaves between its signal and SIGKILL (e.g. 30).")
    return float(value)


def check_stall_warning(value: Any, what: str = "Ring(stall_warning=...)") -> float | None:
    """Seconds a rank may wait in one collective before the stall report; None: never."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise RingtrainError(f"{what} got {value!r}",
                             "give the seconds a rank may wait in a collective before the stall report (e.g. 60), "
                             "or None for no stall reports.")
    return float(value)


def check_collectives(value: Any, what: str = "Ring(debug_collectives=...)") -> float | None:
    """``debug_collectives``: True (checked, ``DEBUG_COLLECTIVES_S``), seconds, or False/None (off)."""
    if value is None or value is False:
        return None
    if value is True:
        return DEBUG_COLLECTIVES_S
    if isinstance(value, (int, float)) and 0 < value < float("inf"):
        return float(value)
    raise RingtrainError(f"{what} got {value!r}",
                         "give True (every collective checked across ranks first, 60 s to agree), a number of "
                         "seconds, or False.")


# --- the text of a variable -> a value, and back ----------------------------------------------------------------
def _text(raw: str) -> str | None:
    return raw or None


def _seconds_or_off(raw: str) -> float | None:
    text = raw.strip().lower()
    if text in _OFF:
        return None
    return float(text)  # ValueError: refused by read


def _collectives(raw: str) -> float | None:
    text = raw.strip().lower()
    if text in _OFF or not text:
        return None
    if text in _ON:
        return DEBUG_COLLECTIVES_S
    return float(text)


def _switch(raw: str) -> bool:
    text = raw.strip().lower()
    if text in _ON:
        return True
    if text in _OFF:
        return False
    raise ValueError(raw)


def _positive_int(raw: str) -> int:
    value = int(raw.strip())
    if value <= 0:
        raise ValueError(raw)
    return value


def _count(raw: str) -> int:
    value = int(raw.strip())
    if value < 0:
        raise ValueError(raw)
    return value


def _grace(raw: str) -> float:
    value = float(raw.strip())
    if not 0 < value < float("inf"):
        raise ValueError(raw)
    return value


def _stall(raw: str) -> float | None:
    value = _seconds_or_off(raw)
    if value is not None and not 0 < value < float("inf"):
        raise ValueError(raw)
    return value


def _debug(raw: str) -> float | None:
    value = _collectives(raw)
    if value is not None and not 0 < value < float("inf"):
        raise ValueError(raw)
    return value


def _signal(raw: str) -> str | None:
    return signal_name(raw.strip(), "RINGTRAIN_PREEMPT_SIGNAL") if raw.strip() else None


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _off_or_number(value: Any) -> str:
    return "0" if value is None else _number(value)


def _bool(value: Any) -> str:
    return "1" if value else "0"


@dataclass(frozen=True)
class Variable:
    """One row of the table: an environment variable and the ``Settings`` field it fills."""

    name: str  # the variable
    field: str | None  # the Settings field; None: another tool's variable ringtrain sets or reads (no setting)
    type: str  # as the docs say it
    default: str  # as the docs say it: what an unset variable means
    meaning: str
    set_by: str  # who sets it (ringtrain run's flag, the agent, torchrun, the user)
    parse: Callable[[str], Any] = _text  # text -> value (ValueError / RingtrainError: refused)
    write: Callable[[Any], str] | None = str  # value -> text; None: ringtrain only reads it
    hint: str = "unset it, or see docs/environment.md."


VARIABLES: tuple[Variable, ...] = (
    Variable("RINGTRAIN_TIMELINE", "timeline", "folder", "off",
             "every ring (and hvd.init) records a Chrome trace of its phases and collectives there",
             "ringtrain run --timeline", hint="give a folder, or unset it."),
    Variable("HOROVOD_TIMELINE", "horovod_timeline", "file or DYNAMIC", "off",
             "Horovod's timeline file for ringtrain's hvd.init (DYNAMIC: wait for hvd.start_timeline)",
             "the user, as under horovodrun", hint="give a FILE.json, DYNAMIC, or unset it."),
    Variable("RINGTRAIN_PREEMPT_SIGNAL", "preempt_signal", "signal name", "SIGTERM alone",
             "the signal a ring with a checkpoint_dir also answers with a checkpoint (SIGTERM always is); "
             "the stack request moves to SIGUSR2 when it is SIGUSR1",
             "ringtrain run --preempt-signal", parse=_signal,
             hint="give the signal the scheduler sends ahead of the end (e.g. SIGUSR1), or unset it."),
    Variable("RINGTRAIN_PREEMPT_GRACE", "preempt_grace", "seconds", f"{DEFAULT_GRACE:g}",
             "the seconds a preemption leaves before SIGKILL (a longer checkpoint is said at start-up)",
             "ringtrain run --preempt-grace", parse=_grace, write=_number,
             hint="set it to the seconds a preemption leaves before SIGKILL (e.g. 30), or unset it."),
    Variable("RINGTRAIN_PREEMPTED_DIR", "marks", "folder", "none",
             "where a node's workers say they saved a preemption checkpoint and left; the agent writes "
             "'signalled' there when a signal reaches it", "ringtrain run's agent (each node)"),
    Variable("RINGTRAIN_STALL_WARNING", "stall_warning", "seconds, or 0/off", f"{STALL_WARNING_S:g}",
             "seconds a rank may wait in one collective before the stall report; 0 or off: never",
             "ringtrain run --stall-warning / --no-stall-check, or the user", parse=_stall, write=_off_or_number,
             hint="set it to seconds (e.g. 60), or 0 to turn stall reports off."),
    Variable("RINGTRAIN_DEBUG_COLLECTIVES", "debug_collectives", "1, seconds, or 0", "0 (off)",
             "every collective checked across ranks first (1: 60 s to agree; a number: those seconds)",
             "the user", parse=_debug, write=_off_or_number,
             hint="set it to 1 (checks on), a number of seconds, or 0."),
    Variable("RINGTRAIN_HVD_CHECKS", "hvd_checks", "1 or 0", "1",
             "ringtrain's Horovod checks that the ranks' collectives match (hvd.init(checks=...) wins)",
             "the user", parse=_switch, write=_bool, hint="set it to 1 or 0."),
    Variable("HOROVOD_FUSION_THRESHOLD", "fusion_threshold", "bytes", "64 MiB",
             "ringtrain's Horovod: the bytes of gradients fused into one all-reduce (0: one per tensor)",
             "ringtrain run --fusion-threshold-mb, or the user", parse=_count,
             hint="set it to a number of bytes, or unset it."),
    Variable("RINGTRAIN_JOB_SECRET", "job_secret", "text", "made per one-node job",
             "the key the liveness board's posts are sealed with (never a command line, never the store)",
             "ringtrain run's agent, rt.launch, or the user (the same on every node)",
             hint="set the same secret on every node, or unset it."),
    Variable("RINGTRAIN_JOB_SECRET_FILE", "job_secret_file", "file", "none",
             "a file holding the job's secret: the form forwarded to ssh hosts", "the user"),
    Variable("RINGTRAIN_AGENT_NONCE", "agent_nonce", "text", "none",
             "drawn per ringtrain run: the workers' hellos carry it, and the agent reads the board with the "
             "hellos of its own workers", "ringtrain run's agent"),
    Variable("RINGTRAIN_LAUNCHER_PID", "launcher_pid", "pid", "none",
             "the agent's process: where a worker's native crash dump is named for the launcher's report",
             "ringtrain run's worker entry", parse=_positive_int, hint="leave it to ringtrain run's worker entry."),
    Variable("RINGTRAIN_CHECK_RESUME", "check_resume", "folder", "none",
             "--check-resume's folder: the rings save there every step, and the second run resumes from it",
             "ringtrain run --check-resume"),
    Variable("RINGTRAIN_PLAN", "plan", "folder", "off",
             "the script runs in planning mode: ring.setup plans every layout (docs/plan.md), writes the plan "
             "in this folder and exits; no process group forms", "ringtrain plan"),
    Variable("RINGTRAIN_NODE_TOKEN", "node_token", "text", "none",
             "a -H node's agent carries it: the launcher finds that process by it to pass on a signal over ssh",
             "ringtrain run -H (each remote node)"),
    Variable("TORCHELASTIC_RUN_ID", "run_id", "text", "none",
             "torchrun's --rdzv-id: names the job (a checkpoint folder's lock, the timeline); 'none' names no job",
             "torchrun (ringtrain run's agent)", write=None),
    Variable("SLURM_JOB_ID", "slurm_job", "text", "none",
             "names the job where torchrun does not; requeue=True requeues it (scontrol requeue)",
             "Slurm", write=None),
    # Other tools' variables ringtrain sets for the workers or reads where it works with that tool: no setting of
    # the contract (no field, read() leaves them alone), listed so that the one table holds every variable.
    Variable("CUDA_VISIBLE_DEVICES", None, "GPU list", "every GPU", "the GPUs this node's workers see",
             "ringtrain run --gpus (the agent)", write=None),
    Variable("OMP_NUM_THREADS", None, "count", "torch's", "the workers' CPU threads: this machine's usable cores "
             "shared among its ranks when it is unset and more than one runs (the user's value is kept)",
             "ringtrain run's agent", write=None),
    Variable("GLOO_SOCKET_IFNAME", None, "interface", "Gloo's choice", "a one-machine job's Gloo listens on "
             "loopback only (unless it is set); horovodrun's --network-interface/--nics choose one",
             "ringtrain run's agent, rt.launch, ringtrain run --nics", write=None),
    Variable("NCCL_SOCKET_IFNAME", None, "interface", "NCCL's choice", "horovodrun's --network-interface/--nics, "
             "as horovodrun sets it", "ringtrain run --nics", write=None),
    Variable("NCCL_IB_DISABLE", None, "1", "unset", "horovodrun's --tcp, as horovodrun sets it",
             "ringtrain run --tcp", write=None),
    Variable("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None, "1", "unset", "an elastic job's workers get a store of "
             "their own each round (unless it is set)", "ringtrain run's agent (elastic jobs)", write=None),
    Variable("TORCHELASTIC_USE_AGENT_STORE", None, "True", "unset", "rt.launch's processes join the store their "
             "parent hosts", "rt.launch", write=None),
    Variable("TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_NCCL_DUMP_ON_TIMEOUT, TORCH_NCCL_DEBUG_INFO_TEMP_FILE", None,
             "torch's", "torch's", "NCCL's flight recorder on, and a dump per rank when a collective times out "
             "(each unless it is set)", "the process-group service (NCCL groups)", write=None),
    Variable("HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE, HOROVOD_CROSS_RANK, "
             "HOROVOD_CROSS_SIZE, HOROVOD_HOSTNAME", None, "Horovod's", "unset", "the script's place as Horovod "
             "says it, from torchrun's variables", "ringtrain run --horovod (the worker entry)", write=None),
    Variable("PYTHONPATH", None, "path", "the user's", "ringtrain's horovod alias package first, for the "
             "processes the script starts", "ringtrain run --horovod, python -m ringtrain.horovod", write=None),
    Variable("HOROVOD_CYCLE_TIME, HOROVOD_CACHE_CAPACITY, HOROVOD_HIERARCHICAL_ALLREDUCE", None, "Horovod's",
             "unset", "horovodrun's other tuning flags (these and the rest of its group in ringtrain run --help), "
             "as the variables horovodrun sets, for the script: ringtrain reads none of them and says so",
             "ringtrain run --cycle-time-ms, --cache-capacity, ...", write=None),
    Variable("PET_*", None, "torchrun's", "unset", "torchrun's flags given as variables: read as the defaults of "
             "ringtrain run's own (as torchrun reads them); -H drops them before the agents start",
             "the user (read by ringtrain run)", write=None),
    Variable("WANDB_PROJECT", None, "text", "ringtrain", "the W&B project of Ring(log_with=['wandb'])",
             "the user (read by ring.log's W&B adapter)", write=None),
    Variable("MLFLOW_TRACKING_URI", None, "URI", "mlflow's", "where Ring(log_with=['mlflow']) logs",
             "the user (read by ring.log's MLflow adapter)", write=None),
)
_BY_FIELD = {v.field: v for v in VARIABLES if v.field is not None}
# a field -> its variable's name (for messages, and the writers' keys)
ENV = {v.field: v.name for v in VARIABLES if v.field is not None}


@dataclass(frozen=True)
class Settings:
    """What a worker's environment says (``read``), typed; ``None``: unset."""

    timeline: str | None = None
    horovod_timeline: str | None = None
    preempt_signal: str | None = None  # a signal's name ("SIGUSR1")
    preempt_grace: float = DEFAULT_GRACE
    marks: str | None = None
    stall_warning: float | None = STALL_WARNING_S  # None: never
    debug_collectives: float | None = None  # the checks' timeout; None: off
    hvd_checks: bool = True
    fusion_threshold: int | None = None
    job_secret: str | None = None
    job_secret_file: str | None = None
    agent_nonce: str | None = None
    launcher_pid: int | None = None
    check_resume: str | None = None
    node_token: str | None = None
    plan: str | None = None  # ringtrain plan's folder: planning mode
    run_id: str | None = None
    slurm_job: str | None = None

    @property
    def job(self) -> str | None:
        """The job this process belongs to, as its launcher names it (the same on every rank and restart). It is
        shown, never trusted: two jobs can be given the same id."""
        if self.run_id and self.run_id != "none":  # torchrun's default --rdzv-id "none" names no job
            return f"torchrun {self.run_id}"
        if self.slurm_job:
            return f"Slurm job {self.slurm_job}"
        return None

    @property
    def preempt_signum(self) -> int | None:
        return signal_of(self.preempt_signal, "RINGTRAIN_PREEMPT_SIGNAL")


def read(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings ``environ`` (default: this process's environment) holds. A variable that cannot be read is
    refused with its name and value; an empty one counts as unset."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for variable in _BY_FIELD.values():
        raw = environ.get(variable.name)
        if raw is None or raw == "":
            continue
        try:
            values[variable.field] = variable.parse(raw)
        except (ValueError, RingtrainError) as e:
            raise RingtrainError(f"environment variable {variable.name}={raw!r} cannot be read (wanted: "
                                 f"{variable.type}; it sets: {variable.meaning})", variable.hint) from e
    return Settings(**values)


def to_environ(settings: Settings | None = None, **fields: Any) -> dict[str, str]:
    """The variables a launcher sets for its workers: those of ``settings`` that differ from the defaults, and
    each of ``fields`` given (a ``Settings`` field name -> its value; ``None``: the variable is left out, but for
    ``stall_warning`` and ``debug_collectives``, where None is "off" and written ``0``). Only the variables
    ringtrain writes (not torchrun's or Slurm's)."""
    given: dict[str, Any] = {}
    if settings is not None:
        default = Settings()
        given = {f.name: getattr(settings, f.name) for f in dataclasses.fields(Settings)
                 if getattr(settings, f.name) != getattr(default, f.name)}
    for name, value in fields.items():
        if name not in _BY_FIELD:
            raise RingtrainError(f"to_environ got {name}=, which is no field of the launcher's settings",
                                 f"give one of: {', '.join(_BY_FIELD)}.")
        given[name] = value
    out = {}
    for name, value in given.items():
        variable = _BY_FIELD[name]
        if variable.write is None:
            if value is not None and name in fields:
                raise RingtrainError(f"to_environ got {name}={value!r}: {variable.name} is set by "
                                     f"{variable.set_by}, not by ringtrain", "leave it out.")
            continue
        if value is None and variable.write is not _off_or_number:
            continue
        out[variable.name] = variable.write(value)
    return out


@contextlib.contextmanager
def exported(variables: Mapping[str, str], environ: MutableMapping[str, str] | None = None) -> Iterator[None]:
    """``variables`` set in this process's environment while the block runs (the workers it starts inherit
    them: torchrun's agent passes its own environment on), and what was there before put back after it."""
    environ = os.environ if environ is None else environ
    before = {name: environ.get(name) for name in variables}
    environ.update(variables)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value


_KEYWORD_DEFAULTS = {"timeline": None, "preempt_signal": None, "preempt_grace": None, "stall_warning": "default",
                     "debug_collectives": False}


def override(settings: Settings, **keywords: Any) -> Settings:
    """``Ring(...)``'s keywords over the environment's settings: a keyword left at its default (``None``;
    ``stall_warning="default"``; ``debug_collectives=False``) keeps the environment's value; one given is checked
    and wins. The one place where "keyword, else environment variable, else default" is decided."""
    changes: dict[str, Any] = {}
    for name, value in keywords.items():
        if name not in _KEYWORD_DEFAULTS:
            raise RingtrainError(f"override got {name}=, which no Ring keyword sets",
                                 f"give one of: {', '.join(_KEYWORD_DEFAULTS)}.")
        if value is _KEYWORD_DEFAULTS[name] or (isinstance(value, str) and value == _KEYWORD_DEFAULTS[name]):
            continue
        if name == "timeline":
            changes[name] = value or None
        elif name == "preempt_signal":
            changes[name] = signal_name(value)
        elif name == "preempt_grace":
            changes[name] = check_grace(value)
        elif name == "stall_warning":
            changes[name] = check_stall_warning(value)
        elif name == "debug_collectives":
            changes[name] = check_collectives(value)
    return dataclasses.replace(settings, **changes) if changes else settings


# --- the marks folder (Settings.marks): how a node's workers tell their agent they saved and left ------------
def mark(rank: int, step: int, folder: str | None) -> None:
    """This rank's checkpoint of ``step`` is on disk and it leaves preempted: a file in the folder its node's
    ``ringtrain run`` gave (``RINGTRAIN_PREEMPTED_DIR``), which that agent reads once its workers are gone —
    a local file, where the job's store may already be gone with node 0."""
    if folder and os.path.isdir(folder):
        with open(os.path.join(folder, f"rank{rank}"), "w") as f:
            f.write(str(step))


def marked(folder: str | None) -> dict[int, int]:
    """The ranks of this node that left preempted, and the step each saved (``mark``)."""
    found: dict[int, int] = {}
    if not folder or not os.path.isdir(folder):
        return found
    for name in os.listdir(folder):
        if name == SIGNALLED:
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                found[int(name.removeprefix("rank"))] = int(f.read().strip())
        except (OSError, ValueError):
            continue
    return found
