"""The house's second rule, beside tests/test_layers.py: who may touch the process environment.

Settings cross from ``ringtrain run`` to its workers as environment variables, and one module reads and writes
them: the launcher contract (parallel/contract.py). The schedulers' and torchrun's own variables are read by the
environment detectors (parallel/environments.py). Everywhere else a component gets its values from whoever built
it — never from ``os.environ``. ``ALLOWED`` names the few other modules that touch the environment, each with its
reason; a new ``os.environ`` / ``os.getenv`` anywhere else fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ringtrain

SRC = Path(ringtrain.__file__).resolve().parent
NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}

ALLOWED = {
    "parallel/contract.py": "the launcher contract: the one reader (read) and writer (to_environ, exported)",
    "parallel/environments.py": "the environment detectors: torchrun's, Slurm's, MPI's, Horovod's own variables",
    "parallel/group.py": "torch's NCCL flight-recorder variables (TORCH_NCCL_*), which torch reads from the "
                         "environment only, set in this process before its group forms",
    "launcher/agent.py": "starting the workers: torchrun's agent passes its environment on; CUDA_VISIBLE_DEVICES, "
                         "GLOO_SOCKET_IFNAME and torchrun's own switch are chosen against the user's",
    "launcher/spawn.py": "rt.launch/spawn: a child's torchrun variables (RANK, MASTER_PORT, ...), as torchrun sets them",
    "launcher/worker.py": "the worker entry: HOROVOD_* and PYTHONPATH for the user's script, torchrun's RANK and "
                          "error file, before the script runs",
    "launcher/hosts.py": "-H: the variables forwarded to ssh hosts (and the job's secret, refused on a command line)",
    "launcher/run.py": "-H: horovodrun's flags as variables for every agent, torchrun's PET_* read as flags",
    "launcher/flags.py": "torchrun's PET_* variables: the defaults of its flags, as torchrun reads them",
    "launcher/horovod_run.py": "horovodrun's --network-interface: GLOO/NCCL_SOCKET_IFNAME for the children",
    "launcher/env_info.py": "ringtrain env: prints the variables that matter, as they are",
    "horovod/__main__.py": "python -m ringtrain.horovod: PYTHONPATH for the alias package, before the script runs",
    "tracking/to_wandb.py": "wandb's own WANDB_PROJECT, read where wandb is called",
    "tracking/to_mlflow.py": "mlflow's own MLFLOW_TRACKING_URI, read where mlflow is called",
    "bench/gpu.py": "the benchmark's worker script: torchrun's RANK/LOCAL_RANK and CUDA_VISIBLE_DEVICES, reported",
    "bench/runner.py": "the benchmark's worker: torchrun's LOCAL_RANK for its device",
    "cli/plan.py": "ringtrain plan: starts the user's script with this environment and the contract's RINGTRAIN_PLAN",
}
# doctor/rules read users' scripts: they name os.environ in the advice they print, never touch it (no entry needed).


def touches(source: str) -> list[int]:
    """The lines of ``source`` that touch the process environment: ``os.environ``, ``os.getenv``, ...,
    ``from os import environ``, and ``import os as x`` followed by ``x.environ``."""
    tree = ast.parse(source)
    aliases = {"os"} | {a.asname for n in ast.walk(tree) if isinstance(n, ast.Import)
                        for a in n.names if a.name == "os" and a.asname}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in NAMES and isinstance(node.value, ast.Name) \
                and node.value.id in aliases:
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(a.name in NAMES for a in node.names):
            lines.append(node.lineno)
    return sorted(set(lines))


def touching() -> dict[str, list[int]]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        lines = touches(path.read_text())
        if lines:
            found[path.relative_to(SRC).as_posix()] = lines
    return found


def test_only_the_contract_the_detectors_and_the_allowed_touch_the_environment():
    found = touching()
    wrong = [f"src/ringtrain/{name}:{lines}" for name, lines in found.items() if name not in ALLOWED]
    assert not wrong, ("modules that read or write os.environ themselves (read the launcher's settings with "
                       "parallel/contract.read(), or hand the value in from whoever builds the component):\n"
                       + "\n".join(wrong))


def test_every_allowed_module_still_needs_its_place():
    """An entry whose module no longer touches the environment is dropped, so the list stays the truth (one named
    before its module is in the tree is not checked until it is)."""
    found = touching()
    stale = sorted(name for name in set(ALLOWED) - set(found) if (SRC / name).exists())
    assert not stale, f"ALLOWED names modules that no longer touch the environment: {stale}"
    assert all(reason for reason in ALLOWED.values())


def test_a_new_read_elsewhere_is_caught():
    for source in ("import os\nx = os.environ.get('RINGTRAIN_TIMELINE')\n",
                   "import os\nx = os.environ['RANK']\n",
                   "import os\nx = os.getenv('RINGTRAIN_STALL_WARNING')\n",
                   "from os import environ\n",
                   "from os import getenv as g\n",
                   "import os as o\no.environ.update(A='1')\n",
                   "import os\ndef f():\n    os.putenv('A', '1')\n"):
        assert touches(source), source
    for source in ("import os\nx = os.path.join('a', 'b')\n",
                   "def f(environ):\n    return environ.get('RANK')\n",  # a mapping handed in: no touch
                   "text = 'os.environ is named in a message'\n"):
        assert not touches(source), source
    # and the rule itself: a module outside ALLOWED that reads it is named
    assert "liveness/watchdog.py" not in ALLOWED and "loop/preempt.py" not in ALLOWED
