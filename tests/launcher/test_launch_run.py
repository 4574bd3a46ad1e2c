"""`ringtrain run` end to end: real processes, real Gloo on 127.0.0.1, through the real CLI."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest
from _launch_util import (
    ALLREDUCE,
    child_env,
    free_port,
    outputs,
    results,
    run_ringtrain,
    two_nodes,
    write,
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flag", ["--nproc-per-node", "--nproc_per_node"])
def test_two_ranks_all_reduce_and_get_script_args(tmp_path, flag):
    script = write(tmp_path / "train.py", ALLREDUCE)
    proc = run_ringtrain("run", flag, "2", str(script), "--foo", "1")
    assert proc.returncode == 0, outputs(proc)
    rows = results(proc.stdout)
    assert [r["rank"] for r in rows] == ["0", "1"], outputs(proc)
    assert all(r["world"] == "2" and r["sum"] == "3.0" and r["foo"] == "1" for r in rows), outputs(proc)
    assert {r["local"] for r in rows} == {"0", "1"}
    # Like `python train.py`: the script's directory first on sys.path, not ringtrain's launch/.
    assert all(r["path0"] == str(tmp_path.resolve()) for r in rows), outputs(proc)


LEGACY = r"""
    import argparse, os, sys
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument({flag!r}, type=int, default=-1)
    parser.add_argument("--lr", type=float)
    args = parser.parse_args()
    dist.init_process_group("gloo", init_method="env://")
    sys.stdout.write(f"RESULT rank={{dist.get_rank()}} arg={{args.local_rank}} env={{os.environ['LOCAL_RANK']}} lr={{args.lr}}\n")
    dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_legacy_local_rank_script_gets_its_local_rank(tmp_path):
    # Written for `python -m torch.distributed.launch`: declares only --local_rank, strict parse_args.
    script = write(tmp_path / "legacy.py", LEGACY.format(flag="--local_rank"))
    proc = run_ringtrain("run", "--nproc-per-node", "2", str(script), "--lr", "0.5")
    assert proc.returncode == 0, outputs(proc)
    assert "unrecognized arguments" not in proc.stderr
    rows = results(proc.stdout)
    assert [(r["arg"], r["env"], r["lr"]) for r in rows] == [("0", "0", "0.5"), ("1", "1", "0.5")], outputs(proc)


ENV_STYLE = r"""
    import sys
    # Like `python train.py`: nothing imported torch yet, so setting CUDA_VISIBLE_DEVICES or
    # OMP_NUM_THREADS here would still take effect.
    assert "torch" not in sys.modules, "the worker entry imported torch before the script"
    import argparse, os
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int)
    args = parser.parse_args()  # strict; declares no --local_rank at all
    sys.stdout.write(f"RESULT rank={os.environ['RANK']} argv={'|'.join(sys.argv[1:])}\n")
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "source, expected_argv",
    [(LEGACY.format(flag="--local-rank"), None), (ENV_STYLE, "--epochs|3")],
    ids=["declares-dashed", "env-style"],
)
def test_local_rank_spelling_follows_the_script(tmp_path, source, expected_argv):
    script = write(tmp_path / "train.py", source)
    extra = ["--lr", "2"] if expected_argv is None else ["--epochs", "3"]
    proc = run_ringtrain("run", "--nproc-per-node", "1", str(script), *extra)
    assert proc.returncode == 0, outputs(proc)
    assert "unrecognized arguments" not in proc.stderr
    (row,) = results(proc.stdout)
    if expected_argv is None:
        assert (row["arg"], row["env"], row["lr"]) == ("0", "0", "2.0"), outputs(proc)
    else:
        assert row["argv"] == expected_argv, outputs(proc)


@pytest.mark.timeout(120)
def test_module_form(tmp_path):
    pkg = tmp_path / "lib" / "mypkg"
    write(pkg / "__init__.py", "")
    write(pkg / "train.py", ALLREDUCE + '    assert sys.argv[0].endswith("train.py"), sys.argv\n')
    proc = run_ringtrain(
        "run", "--nproc-per-node", "2", "-m", "mypkg.train", "--foo", "7",
        env=child_env(str(tmp_path / "lib")), cwd=tmp_path,
    )
    assert proc.returncode == 0, outputs(proc)
    rows = results(proc.stdout)
    assert [(r["rank"], r["sum"], r["foo"]) for r in rows] == [("0", "3.0", "7"), ("1", "3.0", "7")], outputs(proc)
    assert all(r["path0"] == str(tmp_path) for r in rows)  # `python -m`: the current directory


@pytest.mark.timeout(150)
def test_two_nodes_on_loopback(tmp_path):
    script = write(tmp_path / "train.py", ALLREDUCE)
    port = str(free_port())
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port, "--timeout", "60"]
    codes, outs, report = two_nodes(
        lambda rank: ["run", *common, "--node-rank", str(rank), str(script), "--foo", str(rank)], child_env(), 120)
    assert codes == [0, 0], report
    (r0,), (r1,) = results(outs[0][0]), results(outs[1][0])
    assert (r0["rank"], r0["world"], r0["sum"], r0["foo"]) == ("0", "2", "3.0", "0"), report
    assert (r1["rank"], r1["world"], r1["sum"], r1["foo"]) == ("1", "2", "3.0", "1"), report


@pytest.mark.timeout(60)
def test_busy_master_port_is_named_with_a_hint(tmp_path):
    script = write(tmp_path / "train.py", ALLREDUCE)
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = str(holder.getsockname()[1])
        start = time.monotonic()
        proc = run_ringtrain("run", "--nproc-per-node", "2", "--master-port", port, str(script), timeout=45)
        elapsed = time.monotonic() - start
    assert proc.returncode != 0, outputs(proc)
    assert "HINT:" in proc.stderr and port in proc.stderr, outputs(proc)
    assert "Traceback" not in proc.stderr, outputs(proc)
    assert "RESULT" not in proc.stdout  # no worker started
    assert elapsed < 30


@pytest.mark.timeout(90)
def test_unreachable_master_fails_in_bounded_time(tmp_path):
    script = write(tmp_path / "train.py", ALLREDUCE)
    port = str(free_port())  # nobody listens there
    start = time.monotonic()
    proc = run_ringtrain(
        "run", "--nnodes", "2", "--node-rank", "1", "--master-port", port, "--timeout", "5", str(script), timeout=75,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, outputs(proc)
    assert elapsed < 60
    assert f"127.0.0.1:{port}" in proc.stderr and "HINT:" in proc.stderr, outputs(proc)
    assert "Traceback" not in proc.stderr, outputs(proc)


FAILING = """
    import os, sys, time
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("boom from rank one")
    time.sleep(120)  # rank 0 would wait far longer than the test allows: it must be stopped
"""


@pytest.mark.timeout(90)
def test_worker_failure_names_the_rank_and_leaves_no_process(tmp_path):
    marker = f"ringtrain_fail_marker_{time.time_ns()}"
    script = write(tmp_path / marker / "train.py", FAILING)
    start = time.monotonic()
    proc = run_ringtrain("run", "--nproc-per-node", "2", str(script), timeout=75)
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, outputs(proc)
    assert elapsed < 45, outputs(proc)
    report = proc.stderr[proc.stderr.index("ringtrain run: worker rank"):]
    assert report.startswith("ringtrain run: worker rank 1 failed first (local rank 1"), outputs(proc)
    assert "ValueError: boom from rank one" in report and "Traceback" in report, outputs(proc)
    assert "HINT:" in report
    leftover = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", f"workers left behind: {leftover.stdout}"
