"""ringtrain run's command line: its own flags, torchrun's and torch.distributed.launch's
(torchrun_flags.py), horovodrun's (horovod_flags.py), in both spellings, with the tools' abbreviations
(prefixes.py). run.py validates what this parses (``plan_from_args``).

No torch import: ``--help`` and argument errors stay fast.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import HintingParser, RingtrainError
from . import horovod_flags, torchrun_flags
from .ports import TORCHRUN_DEFAULT_PORT
from .prefixes import Vocabulary
from .torchrun_flags import Flag

NPROC_WORDS = ("auto", "gpu", "cpu", "xpu")
DEFAULT_TIMEOUT = 300

# torch 2.13's torch.distributed.run.get_args_parser() option strings, and torch.distributed.launch's
# --use-env: the abbreviations they accept are resolved against this list (tests/launcher/test_flag_parity.py
# checks it against torch's own parser).
TORCHRUN_OPTIONS = (
    "-h", "--help", "--nnodes", "--nproc-per-node", "--nproc_per_node", "--rdzv-backend", "--rdzv_backend",
    "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-id", "--rdzv_id", "--rdzv-conf", "--rdzv_conf", "--standalone",
    "--max-restarts", "--max_restarts", "--monitor-interval", "--monitor_interval", "--start-method",
    "--start_method", "--event-log-handler", "--event_log_handler", "--role", "-m", "--module", "--no-python",
    "--no_python", "--run-path", "--run_path", "--log-dir", "--log_dir", "-r", "--redirects", "-t", "--tee",
    "--local-ranks-filter", "--local_ranks_filter", "--duplicate-stdout-filters", "--duplicate_stdout_filters",
    "--duplicate-stderr-filters", "--duplicate_stderr_filters", "--node-rank", "--node_rank", "--master-addr",
    "--master_addr", "--master-port", "--master_port", "--local-addr", "--local_addr", "--logs-specs",
    "--logs_specs", "--numa-binding", "--numa_binding", "--signals-to-handle", "--signals_to_handle",
    "--shutdown-timeout", "--shutdown_timeout", "--virtual-local-rank", "--virtual_local_rank",
)
LAUNCH_OPTIONS = (*TORCHRUN_OPTIONS, "--use-env", "--use_env")
# The options torchrun also reads from PET_<DEST> (torch/distributed/argparse_util.py `env` and `check_env`):
# a flag left out takes the variable's value (Kubeflow's PyTorchJob sets PET_NNODES, PET_NODE_RANK, ...).
PET_SWITCHES = ("standalone", "module", "no_python", "run_path", "virtual_local_rank")
PET_VALUES = ("nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "max_restarts",
              "monitor_interval", "start_method", "event_log_handler", "role", "log_dir", "redirects", "tee",
              "local_ranks_filter", "duplicate_stdout_filters", "duplicate_stderr_filters", "node_rank",
              "master_addr", "master_port", "local_addr", "signals_to_handle", "shutdown_timeout")


def _pet_default(flag: Flag) -> dict:
    """``flag.kwargs`` with torchrun's PET_<DEST> variable as the default, where torchrun reads one."""
    value = os.environ.get(f"PET_{flag.dest.upper()}")
    if value is None:
        return flag.kwargs
    if flag.dest in PET_SWITCHES:
        return {**flag.kwargs, "default": value.strip() not in ("", "0")}  # check_env: int(value) != 0
    if flag.dest in PET_VALUES:
        return {**flag.kwargs, "default": value}  # argparse applies the flag's type to a text default
    return flag.kwargs


class RunParser(HintingParser):
    """HintingParser that first writes out the abbreviations torchrun and horovodrun accept."""

    vocabulary: Vocabulary

    def parse_known_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        try:
            return super().parse_known_args(self.vocabulary.expand(argv), namespace)
        except RingtrainError as e:  # an ambiguous abbreviation, a refused flag: argparse's exit, our HINT
            self.print_usage(sys.stderr)
            self.exit(2, f"{self.prog}: error: {e}\n")


def _takes(action: argparse.Action) -> int:
    if isinstance(action.nargs, int):
        return action.nargs
    return 0 if action.nargs in ("?", "*") else 1


def build_parser(manual: str) -> argparse.ArgumentParser:
    """The parser; ``manual`` is run.py's docstring (summary, blank line, the rest as the epilog)."""
    summary, _, epilog = manual.partition("\n\n")
    parser = RunParser(
        prog="ringtrain run",
        usage="%(prog)s [options] script.py [script args ...]\n"
        "       %(prog)s [options] -m package.module [module args ...]",
        description=summary.replace("ringtrain run: ", "", 1)
        + "\nEvery flag of torchrun, torch.distributed.launch and horovodrun is taken (both spellings: "
        "--nproc_per_node too), with their meaning.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # `--nproc 2` must be an error, not a silent guess (prefixes.py: the tools' own)
    )
    takes = {"-h": 0, "--help": 0}

    def add(group, flag: Flag) -> None:
        # Both spellings (docs/architecture.md, principle 7); the underscore one is accepted but kept out of
        # --help so the option list stays readable.
        shown = [s for s in flag.strings if "_" not in s]
        hidden = [s for s in flag.strings if "_" in s]
        action = group.add_argument(*shown, dest=flag.dest, **_pet_default(flag))
        takes.update(dict.fromkeys(shown, _takes(action)))
        if hidden:
            alias = {k: v for k, v in flag.kwargs.items() if k not in ("help", "default")}
            group.add_argument(*hidden, dest=flag.dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **alias)
            takes.update(dict.fromkeys(hidden, _takes(action)))

    def both(name: str) -> tuple:
        return (name, "--" + name[2:].replace("-", "_")) if name.count("-") > 2 else (name,)

    own = (
        Flag(both("--nproc-per-node"), "nproc_per_node", {
            "metavar": "N|auto|gpu|cpu", "help": "workers on this node: a number, 'gpu' (one per GPU), 'cpu' (one per "
            "CPU core), or 'auto' (GPUs if any, else CPU cores). Default: 1."}),
        Flag(both("--nnodes"), "nnodes", {
            "metavar": "N|MIN:MAX", "help": "number of nodes; MIN:MAX (2:2 too) for nodes that join by rendezvous "
            "(elastic, c10d). Default: 1."}),
        Flag(both("--node-rank"), "node_rank", {"type": int, "metavar": "R",
                                                "help": "rank of this node, 0..nnodes-1. Default: 0."}),
        Flag(both("--master-addr"), "master_addr", {
            "metavar": "ADDR", "help": "address of node 0, reachable from every node. Default: 127.0.0.1 (one "
            "machine); with -H/--hostfile, the first host's name."}),
        Flag(both("--master-port"), "master_port", {
            "type": int, "metavar": "PORT", "help": "rendezvous port on node 0, the same on every node. Default: a free "
            f"port on a single node, {TORCHRUN_DEFAULT_PORT} with several nodes (as torchrun)."}),
        Flag(both("--gpus"), "gpus", {
            "metavar": "I,J,...", "help": "GPUs the workers may use (sets CUDA_VISIBLE_DEVICES); with --nproc-per-node "
            "gpu or auto, one worker per listed GPU."}),
        Flag(both("--max-restarts"), "max_restarts", {
            "type": int, "default": 0, "metavar": "K",
            "help": "restart this node's workers up to K times after a failure. Default: 0."}),
        Flag(both("--log-dir"), "log_dir", {
            "metavar": "DIR", "help": "directory for torchelastic's per-run logs and error files (and --redirects/--tee "
            "files). Default: a temporary directory."}),
        Flag(("--use-env", "--use_env"), "use_env", {
            "action": "store_true", "default": False,
            "help": "accepted and ignored, as torchrun does: workers always get LOCAL_RANK in their environment."}),
        Flag(both("--timeout"), "timeout", {
            "type": int, "default": None, "metavar": "SECONDS",
            "help": f"how long nodes wait for each other to join the rendezvous. Default: {DEFAULT_TIMEOUT}."}),
        Flag(both("--preempt-signal"), "preempt_signal", {
            "metavar": "SIG", "help": "a signal that preempts the job besides SIGTERM (SIGUSR1 for Slurm's "
            "--signal=USR1@90): every ring with a checkpoint_dir saves the step it is at and the job exits 75 (see "
            "\"Preemption\" below). With SIGUSR1, the stack request (ringtrain stacks) is SIGUSR2."}),
        Flag(both("--preempt-grace"), "preempt_grace", {
            "type": float, "metavar": "SECONDS", "help": "the seconds the scheduler leaves between its signal and "
            "SIGKILL: the workers' rings warn when a checkpoint takes longer, and torchrun's agent waits this long "
            "for them (--shutdown-timeout). Default: 30."}),
        Flag(both("--check-resume"), "check_resume", {
            "type": int, "metavar": "STEP", "help": "prove the script resumes exactly: run it to its end, then again "
            "from its checkpoint of step STEP, and compare every loss and checkpoint past STEP bitwise (exit 0: exact; "
            "1: the first step and tensor that differ). The rings save into a folder of the check's, a checkpoint "
            "every step (see \"Exact resume\" below)."}),
        Flag(both("--timeline"), "timeline", {
            "metavar": "DIR", "help": "record every rank's steps (data, forward, backward, each gradient bucket's "
            "all-reduce, optimizer, checkpoint, collectives) into DIR/timeline.json (Perfetto / chrome://tracing) and "
            "DIR/timeline.png (see \"Seeing where a step goes\" below). Sets RINGTRAIN_TIMELINE=DIR for the workers."}),
    )
    for flag in own:
        add(parser, flag)
    torchrun_flags.add_to(parser, add)

    horovod = parser.add_argument_group("Horovod scripts and horovodrun's flags (see \"Horovod scripts\" below)")
    for flag in (
        Flag(("--horovod",), "horovod", {"action": "store_true", "help": "let workers `import horovod.torch` "
             "(ringtrain's) and give them the HOROVOD_* variables."}),
        Flag(("-np", "--num-proc"), "np", {"type": int, "metavar": "N",
             "help": "total number of processes; alone, the same as --nproc-per-node N."}),
        Flag(("-H", "--hosts"), "hosts", {"metavar": "HOST:N,...", "help": "hosts and their slots, node 0 first, "
             "e.g. node1:4,node2:4 (local names start here, others over ssh)."}),
        Flag(("-hostfile", "--hostfile"), "hostfile", {"metavar": "FILE",
             "help": "like -H, from a file of `host slots=N` lines."}),
        Flag(("-p", "--ssh-port", "--ssh_port"), "ssh_port", {"type": int, "metavar": "PORT",
             "help": "the port of the hosts' sshd, for hosts started over ssh (ssh -p). Default: ssh's."}),
        Flag(("-i", "--ssh-identity-file", "--ssh_identity_file"), "ssh_identity_file", {"metavar": "FILE",
             "help": "the private key for hosts started over ssh (ssh -i). Default: ssh's."}),
        Flag(("--ssh-strict-host-keys", "--ssh_strict_host_keys"), "ssh_strict_host_keys", {"action": "store_true",
             "help": "refuse hosts whose ssh key is not yet known (ssh's own StrictHostKeyChecking). Default: "
             "learn a new host's key, refuse a changed one (accept-new)."}),
    ):
        add(horovod, flag)
    for action in horovod_flags.add_to(parser, add):  # --version and the refused flags, added as they are
        takes.update(dict.fromkeys(action.option_strings, _takes(action)))

    add(parser, Flag(("-m", "--module"), "module", {"action": "store_true",
                                                    "help": "the target is a module name, run like `python -m`."}))
    parser.add_argument("script", metavar="script.py", help="the training script (or module, with -m).")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.vocabulary = Vocabulary(takes, {"torchrun": LAUNCH_OPTIONS, "horovodrun": horovod_flags.HOROVODRUN_OPTIONS})
    return parser
