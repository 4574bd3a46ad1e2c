"""The guide's command sequences, run in the order written, as a new user runs them: in one scratch folder, each
command's exit code checked, and every file the commands before it wrote (and the demo's ``runs/digits/``) still
byte for byte what it was. docs/from-a-script.md's DDP then FSDP runs of examples/gpt_steps.py, and
docs/launching.md's "Two nodes, tried on one machine" (two terminals, then the -H command), wrote into one folder:
the FSDP run resumed the finished DDP checkpoint and trained nothing, and the two-node runs replaced the demo's
metrics, pictures and checkpoint with a 1-epoch run's. The zh-CN pages give the same commands."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
TIMEOUT = 420  # one command on 2 loaded cores (they take 15-60 s alone)


def _blocks(page: Path, marker: str) -> list[str]:
    """The commands of the page's bash blocks that mention ``marker``: comments dropped, one string a command."""
    commands = []
    for block in re.findall(r"(?ms)^```bash\n(.*?)^```", page.read_text()):
        if marker not in block:
            continue
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


SEQUENCES = {
    "from-a-script": ("examples/gpt_steps.py", "ringtrain run"),
    "launching": ("examples/digits.py --epochs 1", "ringtrain run"),
}


def _commands(page: str, lang: str = "") -> list[str]:
    marker, prefix = SEQUENCES[page]
    path = ROOT / "docs" / f"{page}{'.' + lang if lang else ''}.md"
    return [c for c in _blocks(path, marker) if prefix in c]


@pytest.mark.parametrize("page", sorted(SEQUENCES))
def test_the_chinese_page_gives_the_same_commands(page):
    assert _commands(page), f"docs/{page}.md has no such commands"
    assert _commands(page, "zh-CN") == _commands(page)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _snapshot(folder: Path) -> dict[str, str]:
    found = {}
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and "examples" not in path.relative_to(folder).parts[:1]:
            found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _steps(commands: list[str]) -> list[list[str]]:
    """Commands in order; the node-rank 0 and 1 lines of one job are one step (two terminals at once)."""
    steps: list[list[str]] = []
    for command in commands:
        if "--node-rank" in command and steps and all("--node-rank" in c for c in steps[-1]) and len(steps[-1]) < 2:
            steps[-1].append(command)
        else:
            steps.append([command])
    return steps


def _run_in_order(folder: Path, commands: list[str]) -> list[str]:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1"}
    env.pop("RINGTRAIN_STRATEGY", None)
    outputs = []
    for step in _steps(commands):
        before = _snapshot(folder)
        port = str(_free_port())  # as written but the port: 29500 may be another test's, on a shared machine
        procs = [subprocess.Popen(["bash", "-c", c.replace("29500", port)], cwd=folder, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
                 for c in step]
        for command, proc in zip(step, procs):
            try:
                out, _ = proc.communicate(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                for p in procs:
                    os.killpg(p.pid, 9)
                pytest.fail(f"{command!r} did not end in {TIMEOUT} s")
            outputs.append(out)
            assert proc.returncode == 0, f"{command!r} exited {proc.returncode}:\n{out[-3000:]}"
        after = _snapshot(folder)
        changed = sorted(p for p, digest in before.items() if after.get(p) != digest)
        assert not changed, f"{' and '.join(map(repr, step))} changed what was there before it: {changed[:8]}"
    return outputs


@pytest.fixture
def scratch(tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    demo = tmp_path / "runs" / "digits"  # what `make demo` left: it must survive the guide's commands
    (demo / "log").mkdir(parents=True)
    (demo / "checkpoint.pt").write_bytes(b"the demo's checkpoint")
    (demo / "log" / "metrics.csv").write_text("step,time,loss\n184,0.0,0.1\n")
    return tmp_path


@pytest.mark.timeout(2 * TIMEOUT + 60)
def test_from_a_script_runs_in_order_and_keeps_what_it_wrote(scratch):
    commands = _commands("from-a-script")
    assert len(commands) == 2 and "fsdp" in commands[1]
    ddp, fsdp = _run_in_order(scratch, commands)
    assert "resumed from" not in fsdp, f"the FSDP run resumed an earlier run instead of training:\n{fsdp[-2000:]}"
    assert re.search(r"iter \d+: loss", fsdp) and "nothing is left to train" not in fsdp, fsdp[-2000:]


@pytest.mark.timeout(2 * TIMEOUT + 60)
def test_two_nodes_on_one_machine_runs_in_order_and_keeps_the_demo(scratch):
    commands = _commands("launching")
    assert len(commands) == 3 and "-H" in shlex.split(commands[2])
    outputs = _run_in_order(scratch, commands)
    assert all("final held-out accuracy" in out for out in outputs[::2]), outputs[0][-2000:]
