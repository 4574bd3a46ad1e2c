"""Upstream tutorials' command lines, as their authors wrote them, through ``ringtrain run``.

Each script here is a CPU twin of an upstream script with the same launch contract (see its docstring); each
test starts it with the authors' exact command line, ``torchrun`` / ``horovodrun`` /
``python -m torch.distributed.launch`` replaced by ``ringtrain run`` (``--horovod`` for Horovod's). 2 ranks,
a few steps, Gloo on 127.0.0.1, every run bounded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _launch_util import RINGTRAIN_SRC, child_env, free_port, outputs, results, ringtrain_cmd

HERE = Path(__file__).resolve().parent
ALIAS = os.path.join(RINGTRAIN_SRC, "ringtrain", "horovod", "_alias")
LIMIT = 240  # seconds per command: the machine is shared; a healthy run takes 5-15 s idle

pytestmark = pytest.mark.timeout(2 * LIMIT)


@pytest.fixture
def workdir(tmp_path):
    """The scripts copied to a fresh folder, run from there (snapshot.pt and ./discover.sh are relative)."""
    for name in ("multigpu_torchrun.py", "multinode.py", "legacy_launch.py", "pytorch_mnist.py",
                 "pytorch_mnist_elastic.py", "discover.sh"):
        shutil.copy2(HERE / name, tmp_path / name)
    return tmp_path


def ringtrain_run(line: str, cwd: Path) -> subprocess.CompletedProcess:
    """``ringtrain run`` + the authors' arguments (a line as they wrote it, split on spaces)."""
    return subprocess.run(ringtrain_cmd("run", *line.split()), capture_output=True, text=True, timeout=LIMIT,
                          env=child_env(), cwd=cwd)


def _same_weights(rows: list, key: str = "weights") -> None:
    assert len({r[key] for r in rows}) == 1, rows  # the ranks trained one model together


def test_torchrun_standalone(workdir):
    # pytorch/examples: torchrun --standalone --nproc_per_node=2 multigpu_torchrun.py 50 10
    proc = ringtrain_run("--standalone --nproc_per_node=2 multigpu_torchrun.py 50 10", workdir)
    assert proc.returncode == 0, outputs(proc)
    rows = results(proc.stdout)
    assert [(r["rank"], r["world"], r["steps"]) for r in rows] == [("0", "2", "50"), ("1", "2", "50")], outputs(proc)
    _same_weights(rows)
    assert (workdir / "snapshot.pt").exists()


def _two_agents(line: str, cwd: Path) -> list:
    procs = [subprocess.Popen(ringtrain_cmd("run", *line.split()), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=child_env(), cwd=cwd) for _ in range(2)]
    done = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=LIMIT)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


@pytest.mark.parametrize("nodes", [
    # pytorch/examples: torchrun --nnodes=2 --nproc_per_node=4 --rdzv_id=456 --rdzv_backend=c10d
    #   --rdzv_endpoint=HOST:29603 multinode.py 50 10   (one worker per node here, both nodes on this machine)
    "--nnodes=2 --nproc_per_node=1 --rdzv_id=456 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:{port}",
    # issue 23: `--nnodes 2:2` on two agents became two node-0s
    "--nnodes 2:2 --nproc-per-node 1 --master-port {port}",
])
def test_two_agents_form_one_job(workdir, nodes):
    procs = _two_agents(nodes.format(port=free_port()) + " multinode.py 5 2", workdir)
    for proc in procs:
        assert proc.returncode == 0, outputs(proc)
    rows = sorted((row for proc in procs for row in results(proc.stdout)), key=lambda r: int(r["rank"]))
    assert [(r["rank"], r["world"], r["steps"]) for r in rows] == [("0", "2", "5"), ("1", "2", "5")], \
        [outputs(p) for p in procs]
    _same_weights(rows)


def test_torch_distributed_launch_with_an_abbreviated_flag(workdir):
    # python -m torch.distributed.launch --nnode=1 --node_rank=0 --nproc_per_node=2 example.py
    proc = ringtrain_run("--nnode=1 --node_rank=0 --nproc_per_node=2 legacy_launch.py", workdir)
    assert proc.returncode == 0, outputs(proc)
    rows = results(proc.stdout)
    assert [(r["rank"], r["world"], r["local_rank"], r["env_local_rank"]) for r in rows] == \
        [("0", "2", "0", "0"), ("1", "2", "1", "1")], outputs(proc)
    _same_weights(rows)


def test_horovodrun_gloo(workdir):
    # Horovod: horovodrun --gloo -np 2 python pytorch_mnist.py
    proc = ringtrain_run("--horovod --gloo -np 2 python pytorch_mnist.py", workdir)
    assert proc.returncode == 0, outputs(proc)
    rows = results(proc.stdout)
    assert [(r["rank"], r["world"]) for r in rows] == [("0", "2"), ("1", "2")], outputs(proc)
    _same_weights(rows, "params")


def test_horovod_run_from_a_plain_python(workdir):
    # Horovod: python pytorch_mnist.py --num-proc 2 (horovod.run), with ringtrain's `horovod` on PYTHONPATH
    env = child_env(ALIAS)
    proc = subprocess.run([sys.executable, "pytorch_mnist.py", "--num-proc", "2", "--communication", "gloo"],
                          capture_output=True, text=True, timeout=LIMIT, env=env, cwd=workdir)
    assert proc.returncode == 0, outputs(proc)
    rows = results(proc.stdout)
    assert [(r["rank"], r["world"]) for r in rows] == [("0", "2"), ("1", "2")], outputs(proc)
    returned = next(line for line in proc.stdout.splitlines() if line.startswith("RETURNED "))
    ranks = eval(returned[len("RETURNED "):])  # noqa: S307 - the script's own repr of a list of tuples
    assert [r[:2] for r in ranks] == [(0, 2), (1, 2)], returned  # each rank's result, in rank order
    assert f"{ranks[0][2]:.6f}" == rows[0]["params"], (returned, rows)


def test_horovodrun_elastic_with_a_discovery_script(workdir):
    # Horovod: horovodrun -np 2 --min-np 1 --max-np 4 --host-discovery-script ./discover.sh
    #   python pytorch_mnist_elastic.py   (discover.sh prints localhost:2)
    proc = ringtrain_run("--horovod -np 2 --min-np 1 --max-np 4 --host-discovery-script ./discover.sh "
                         "python pytorch_mnist_elastic.py", workdir)
    assert proc.returncode == 0, outputs(proc)
    rows = results(proc.stdout)
    assert [(r["rank"], r["world"], r["epoch"]) for r in rows] == [("0", "2", "2"), ("1", "2", "2")], outputs(proc)
    assert {r["steps"] for r in rows} == {"8"}, rows  # 2 epochs x 64 samples per rank / batch 16
    _same_weights(rows, "params")


def _code_lines(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("import")):]  # after the docstring


def test_a_step_based_gpt_script_converted_in_few_lines_trains_as_its_original(tmp_path):
    """Issue 30: nanoGPT's loop (its own get_batch, accumulation, estimate_loss, a checkpoint with extras) converted
    to ringtrain (examples/gpt_steps.py): at most 20 lines of the converted script are new or changed; in one
    process both print the same losses and end with the same weights (on several, the converted one evaluates on
    every rank — FSDP's forward needs them all — so its ranks draw other random batches); under ringtrain run on
    two ranks it trains, saves its checkpoint with its extras, and writes the periodic ones."""
    import difflib

    import torch

    converted = HERE.parents[1] / "examples" / "gpt_steps.py"
    diff = difflib.unified_diff(_code_lines(HERE / "nanogpt_train.py"), _code_lines(converted), lineterm="", n=0)
    changed = [line for line in diff if line.startswith("+") and not line.startswith("+++")]
    assert len(changed) <= 20, changed
    runs = {}
    for name, script in (("original", HERE / "nanogpt_train.py"), ("converted", converted)):
        out = tmp_path / name
        proc = subprocess.run([sys.executable, str(script), "--out_dir", str(out), "--max_iters", "12"],
                              capture_output=True, text=True, timeout=LIMIT, env=child_env(), cwd=tmp_path)
        assert proc.returncode == 0, outputs(proc)
        printed = [line for line in proc.stdout.splitlines() if line.startswith(("step ", "iter "))]
        final = torch.load(out / "final.pt", weights_only=True)
        runs[name] = (printed, final.get("model", final))
    assert runs["original"][0] == runs["converted"][0] and len(runs["original"][0]) == 5
    assert all(torch.equal(runs["original"][1][k], runs["converted"][1][k]) for k in runs["original"][1])
    out = tmp_path / "two"
    proc = ringtrain_run(f"--nproc-per-node 2 {converted} --out_dir {out} --max_iters 10", tmp_path)
    assert proc.returncode == 0, outputs(proc)
    assert rt_values(out / "ckpt.pt")["model_args"]["n_layer"] == 2
    assert sorted(os.listdir(out / "ring")) == ["losses", "manifest.json", "step-000000005.pt", "step-000000010.pt"]


def rt_values(path: Path) -> dict:
    import ringtrain as rt

    return rt.checkpoint_values(str(path))
