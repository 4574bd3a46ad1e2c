"""Every ``ringtrain`` command (issue 33, items 3 and 6), run as a user runs it, in a subprocess:

* a wrong argument is refused — with a HINT, no traceback — before torch loads: each runs with torch made
  unimportable (tests/helpers/hide), so a command that imported it first would end in ModuleNotFoundError;
* a command (or a ring's feature) missing an optional package says so once, naming the extra of
  pyproject.toml that brings it, and that extra does bring it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import stat
import sys
import time
from pathlib import Path

import pytest
from _launch_util import HELPERS, RINGTRAIN_SRC, child_env, outputs, ringtrain_cmd

from ringtrain.cli import COMMANDS
from ringtrain.errors import EXTRA_PACKAGES

HIDE = os.path.join(HELPERS, "hide")  # its sitecustomize makes RINGTRAIN_TEST_HIDE's modules unimportable
ROOT = Path(RINGTRAIN_SRC).parent
NO_PID = "4194305"  # above Linux's largest pid_max: never a process


def ringtrain(tmp_path, *argv: str, hide: str = "", timeout: float = 120, program=("-m", "ringtrain")):
    env = child_env(HIDE, RINGTRAIN_TEST_HIDE=hide)
    return subprocess.run([sys.executable, *program, *argv], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=tmp_path)


# --- item 6: arguments are checked before torch loads ----------------------------------------------------------
# command -> (its arguments, what the refusal says, exit code). Every command that takes a path or a value is here.
REFUSALS = {
    "run": (["nope.py"], "training script 'nope.py' does not exist", 2),
    "bench": (["--workload", "cifar-resnet18", "--data", "nope"], "--data 'nope' has no CIFAR-100 'train' file", 2),
    "doctor": (["nope.py"], "nope.py: no such file or folder", 2),
    "stacks": ([NO_PID], f"no process {NO_PID}", 1),
    "timeline": (["nope"], "no timeline part", 2),
    "plot": (["nope"], "'nope' has no metrics.csv", 1),
    "consolidate": (["nope", "out.pt"], "'nope' is not a folder", 2),
    "plan": (["nope.py"], "the script 'nope.py' is not a file", 2),
}
MORE_REFUSALS = [
    ("consolidate", [".", "nowhere/out.pt"], "OUT.pt 'nowhere/out.pt' cannot be written", 2),
    ("bench", ["--modes", "ddp,nope"], "unknown ['nope']", 2),
    ("bench", ["--comm", "--nprocs", "1"], "an all-reduce needs at least 2 processes", 2),
    ("bench", ["--workload", "mlp", "--sync-bn"], "its model has no BatchNorm layer", 2),
    ("run", ["--nproc-per-node", "0", "train.py"], "a node needs at least one worker", 2),
]


def test_every_command_with_arguments_is_checked():
    # `ringtrain env` takes no argument: it prints what it finds (torch's absence included) and exits 0.
    assert set(REFUSALS) == set(COMMANDS) - {"env"}


@pytest.mark.parametrize("command, argv, said, code",
                         [(c, *REFUSALS[c]) for c in REFUSALS] + MORE_REFUSALS, ids=lambda v: str(v)[:20])
def test_a_wrong_argument_is_refused_before_torch_loads(tmp_path, command, argv, said, code):
    proc = ringtrain(tmp_path, command, *argv, hide="torch")
    assert proc.returncode == code, outputs(proc)
    assert said in proc.stderr and "HINT:" in proc.stderr, outputs(proc)
    assert "Traceback" not in proc.stdout + proc.stderr, outputs(proc)


# --- item 3: a missing optional package names its extra, once -------------------------------------------------
def _run_folder(tmp_path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.csv").write_text("step,time,loss\n1,0,0.5\n2,1,0.4\n")
    return folder


def _plan_script(tmp_path) -> Path:
    script = tmp_path / "train.py"
    script.write_text("import torch, ringtrain as rt\nring = rt.Ring()\nmodel = torch.nn.Linear(4, 4)\n"
                      "model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))\n"
                      "model(torch.randn(2, 4))\n")
    return script


def _timeline_parts(tmp_path) -> Path:
    folder = tmp_path / "tl"
    folder.mkdir()
    for rank in range(2):
        part = {"format": "ringtrain-timeline-part/1", "rank": rank, "world_size": 2, "job": "j",
                "events": [["forward", 0, 0, 1.0, 1.002, 0, None], ["backward", 0, 0, 1.002, 1.005, 0, None]]}
        (folder / f"timeline.rank-{rank}.json").write_text(json.dumps(part))
    return folder


TIMELINE_JOB = """
import torch, torch.nn.functional as F
import ringtrain as rt
ring = rt.Ring(device="cpu", seed=0)
net, opt = ring.setup(torch.nn.Linear(4, 2), torch.optim.SGD(torch.nn.Linear(4, 2).parameters(), lr=0.1))
data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
for epoch in ring.epochs(1):
    for x, y in ring.loader(data, batch_size=4):
        ring.backward(F.cross_entropy(net(x), y))
        opt.step(); opt.zero_grad()
"""


def _timeline_job(tmp_path) -> Path:
    (tmp_path / "train.py").write_text(TIMELINE_JOB)
    return tmp_path / "train.py"


# what -> (make its input, its command line, modules hidden, the extra it must name, exit code, what else it says)
EXTRAS = {
    "ringtrain plot": (_run_folder, lambda p: ["plot", str(p)], "matplotlib", "plot", 1, None),
    "ringtrain plan (plan.png)": (_plan_script, lambda p: ["plan", str(p)], "matplotlib", "plot", 0, "plan.json"),
    "ringtrain timeline": (_timeline_parts, lambda p: ["timeline", str(p)], "matplotlib", "plot", 0, "timeline.json"),
    "ringtrain run --timeline (its picture)": (
        _timeline_job, lambda p: ["run", "--nproc-per-node", "2", "--timeline", "tl", str(p)], "matplotlib", "plot",
        0, "timeline of 2 rank(s)"),
    "ringtrain bench (the digits)": (None, lambda _: ["bench", "--quick"], "sklearn,torch", "bench", 2, None),
    # said before the runs (here ended at once by an argument that needs torch to check): the rest runs without it
    "ringtrain bench (throughput.png)": (None, lambda _: ["bench", "--workload", "mlp", "--device", "cuda"],
                                         "matplotlib", "bench", 2, "results.csv and results.json come without it"),
    "ringtrain bench --preset gpu (throughput.png)": (None, lambda _: ["bench", "--preset", "gpu"], "matplotlib",
                                                      "bench", 2, "come without it"),
    "ring.log to TensorBoard (log_with)": (
        None, lambda _: ["-c", "import ringtrain as rt; rt.Ring(log_with=['tensorboard'])"], "tensorboard", "track",
        1, None),
    "ring.log's pictures (the demo, examples/digits.py)": (
        None, lambda _: [str(ROOT / "examples" / "digits.py"), "--epochs", "1", "--out", "out", "--device", "cpu"],
        "matplotlib", "plot", 0, "final held-out accuracy"),
    "the digits (examples/digits.py)": (
        None, lambda _: [str(ROOT / "examples" / "digits.py"), "--epochs", "1", "--out", "out"], "sklearn", "bench",
        1, None),
}


# The commands that need no optional package (the README's install table says so too).
NEEDS_NOTHING = {"env", "doctor", "stacks", "consolidate"}


def test_every_command_that_needs_an_optional_package_is_checked():
    checked = {what.split()[1] for what in EXTRAS if what.startswith("ringtrain ")}
    assert checked | NEEDS_NOTHING == set(COMMANDS) and not checked & NEEDS_NOTHING


@pytest.mark.timeout(300)
@pytest.mark.parametrize("what", list(EXTRAS))
def test_a_missing_optional_package_names_its_extra_once(tmp_path, what):
    make, argv, hide, extra, code, also = EXTRAS[what]
    made = make(tmp_path) if make else None
    args = argv(made)
    plain_python = args[0] == "-c" or args[0].endswith(".py")
    proc = ringtrain(tmp_path, *(args if plain_python else args[1:]), hide=hide, timeout=240,
                     program=() if plain_python else ("-m", "ringtrain", args[0]))
    said = proc.stdout + proc.stderr
    assert proc.returncode == code, outputs(proc)
    assert said.count(f'pip install "ringtrain[{extra}]"') == 1, outputs(proc)
    assert f'HINT: pip install "ringtrain[{extra}]"' in said and "is not installed" in said, outputs(proc)
    if also:
        assert also in said, outputs(proc)


def test_each_extra_named_brings_its_package():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = {("plot", "matplotlib"), ("bench", "sklearn"), ("bench", "matplotlib"), ("track", "tensorboard")}
    assert {extra for extra, _ in wanted} | {e for *_, e, _, _ in EXTRAS.values()} <= set(extras)
    for extra, module in wanted:
        names = [re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower() for req in extras[extra]]
        assert EXTRA_PACKAGES[module] in names, (extra, extras[extra])


OPTIONAL = set(EXTRA_PACKAGES) | {"wandb", "mlflow", "monai", "nibabel", "torch.utils.tensorboard"}


def test_every_optional_import_in_the_library_says_its_extra():
    """A module of ringtrain that imports an optional package also asks errors.import_extra / missing_extra for it
    (which name the extra; errors.pyplot asks for matplotlib), unless it is a ring.log adapter (tracking/adapter.py checks those before the Ring
    forms). A new `import matplotlib` elsewhere fails here until it says what brings it."""
    import ast

    src = Path(RINGTRAIN_SRC) / "ringtrain"
    silent = []
    for path in src.rglob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        optional = {name for name in imported if any(name == o or name.startswith(o + ".") for o in OPTIONAL)}
        asked = {node.args[0].value.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Call)
                 and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("import_extra", "missing_extra")
                 and node.args and isinstance(node.args[0], ast.Constant)}
        if any(isinstance(node, ast.Call) and getattr(node.func, "id", None) == "pyplot" for node in ast.walk(tree)):
            asked.add("matplotlib")
        adapter = path.parent.name == "tracking" and path.name.startswith("to_")
        for name in sorted(optional):
            if not adapter and name.split(".")[0] not in asked:
                silent.append(f"{path.relative_to(src)}: import {name}")
    assert not silent, "optional imports that do not name their extra:\n" + "\n".join(silent)


# --- Issue 37, item 4: consolidate never destroys its source, and replaces only a regular file, with --force ----

def _sharded_checkpoint(tmp_path):
    """A real sharded folder written by ring.save(full=False) in one process."""
    import torch

    import ringtrain as rt

    folder = tmp_path / "ckpt"
    ring = rt.Ring()
    model = ring.setup(torch.nn.Linear(3, 2))
    ring.save(str(folder), full=False, model=model)
    ring.close()
    return folder


def _contents(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.timeout(120)
def test_consolidate_refuses_an_output_inside_its_source_and_leaves_it_byte_identical(tmp_path):
    folder = _sharded_checkpoint(tmp_path)
    before = _contents(folder)
    (tmp_path / "link.pt").symlink_to(folder / "ringtrain.pt")
    for out in (folder / "ringtrain.pt", folder / "__0_0.distcp", folder / "new.pt", folder, tmp_path / "link.pt"):
        proc = subprocess.run(ringtrain_cmd("consolidate", str(folder), str(out)), capture_output=True, text=True,
                              timeout=60, env=child_env())
        assert proc.returncode == 2, (out, outputs(proc))
        assert "nothing was written" in proc.stderr or "is a folder" in proc.stderr, (out, proc.stderr)
    assert _contents(folder) == before


@pytest.mark.timeout(120)
def test_consolidate_replaces_an_existing_file_only_with_force_and_never_a_device(tmp_path):
    folder = _sharded_checkpoint(tmp_path)
    out = tmp_path / "out.pt"
    out.write_bytes(b"mine")
    proc = subprocess.run(ringtrain_cmd("consolidate", str(folder), str(out)), capture_output=True, text=True,
                          timeout=60, env=child_env())
    assert proc.returncode == 2 and "pass --force" in proc.stderr and out.read_bytes() == b"mine", outputs(proc)
    proc = subprocess.run(ringtrain_cmd("consolidate", str(folder), str(out), "--force"), capture_output=True,
                          text=True, timeout=120, env=child_env())
    assert proc.returncode == 0 and out.read_bytes() != b"mine", outputs(proc)
    os.mkfifo(tmp_path / "pipe")
    proc = subprocess.run(ringtrain_cmd("consolidate", str(folder), str(tmp_path / "pipe"), "--force"),
                          capture_output=True, text=True, timeout=60, env=child_env())
    assert proc.returncode == 2 and "not a regular file" in proc.stderr, outputs(proc)
    assert stat.S_ISFIFO(os.stat(tmp_path / "pipe").st_mode)


def test_ctrl_c_before_a_command_takes_it_is_one_line_not_a_traceback():
    # ringtrain run's start-up (torch importing, the preflight checks) printed 20-40 lines of KeyboardInterrupt
    # traceback for a Ctrl-C; any command's start is now one line, and the process ends by SIGINT as a shell expects.
    code = ("import sys, types, ringtrain.cli as cli\n"
            "def main(argv):\n    raise KeyboardInterrupt\n"
            "sys.modules['starting'] = types.SimpleNamespace(main=main)\n"
            "cli.COMMANDS['starting'] = cli.Command('starting', 'a command still starting up')\n"
            "sys.exit(cli.main(['starting']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=child_env())
    assert proc.returncode == -signal.SIGINT and proc.stderr == "ringtrain starting: interrupted (SIGINT)\n", \
        outputs(proc)


@pytest.mark.timeout(120)
def test_ctrl_c_while_ringtrain_run_starts_shows_no_traceback(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("print('ran')\n")
    proc = subprocess.Popen(ringtrain_cmd("run", "--nproc-per-node", "2", str(script)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # Ctrl-C while torch is importing (1-3 s on 2 cores): from the moment its library is mapped, inside the command
    # (a fixed sleep landed before Python had started the command at all on a loaded machine, or after).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if "libtorch" in open(f"/proc/{proc.pid}/maps").read():
                break
        except OSError:
            pass
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=90)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, f"--- exit {proc.returncode}\n{out}\n{err}"
