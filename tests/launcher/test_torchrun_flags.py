"""torchrun's rendezvous and pass-through flags in ringtrain's terms (torchrun_flags.py), checked before anything
starts: in-process, no workers."""

from __future__ import annotations

import sys

import pytest

from ringtrain.errors import RingtrainError
from ringtrain.launcher import agent, plan as plans, run, waiting


def plan(tmp_path, *argv):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    return plans.plan_from_args(run.build_parser().parse_args([*argv, str(script)]))


def test_standalone_is_one_node_on_a_free_port(tmp_path):
    p = plan(tmp_path, "--standalone", "--nproc_per_node=2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1")
    assert (p.nnodes, p.master_addr, p.master_port, p.elastic, p.rdzv_backend) == ("1", "127.0.0.1", None, False, None)
    with pytest.raises(RingtrainError, match="--standalone with --nnodes 2"):
        plan(tmp_path, "--standalone", "--nnodes", "2")


def test_a_range_of_nodes_is_elastic_equal_ends_included(tmp_path):
    assert not plan(tmp_path, "--nnodes", "2").elastic
    for spec in ("2:2", "1:4"):
        p = plan(tmp_path, "--nnodes", spec, "--master-port", "29555")
        args = agent.torchrun_args(p, 29555)
        assert p.elastic and args.rdzv_backend == waiting.ELASTIC and args.rdzv_endpoint == "127.0.0.1:29555"


def test_rdzv_flags_reach_torchrun(tmp_path):
    p = plan(tmp_path, "--nnodes=2", "--rdzv_id=456", "--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1:29603",
             "--rdzv-conf", "join_timeout=900,read_timeout=5", "--timeout", "40")
    args = agent.torchrun_args(p, p.master_port)
    # torch's c10d, wrapped so that it says what it waits for
    assert (args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == (waiting.ELASTIC, "10.0.0.1:29603", "456")
    # the user's keys win over ringtrain's (join_timeout from --timeout), the others stay
    assert args.rdzv_conf.split(",") == ["join_timeout=900", "last_call_timeout=20", "read_timeout=5"]
    c10d_default = plan(tmp_path, "--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1]")
    assert (c10d_default.master_addr, c10d_default.master_port) == ("[::1]", 29400)


def test_a_static_endpoint_is_the_master_address(tmp_path):
    p = plan(tmp_path, "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "10.0.0.7:29611")
    args = agent.torchrun_args(p, p.master_port)
    assert (p.elastic, p.master_addr, p.master_port) == (False, "10.0.0.7", 29611)
    assert args.rdzv_backend == "ringtrain" and "rank=1" in args.rdzv_conf.split(",")
    with pytest.raises(RingtrainError, match="disagree"):
        plan(tmp_path, "--rdzv-endpoint", "10.0.0.7:29611", "--master-port", "29500")


@pytest.mark.parametrize("argv, words", [
    (["--redirects", "9"], "--redirects '9'"),
    (["-t", "0:1,x"], "--tee '0:1,x'"),
    (["--signals-to-handle", "SIGTERM,SIGUSR1"], "SIGUSR1"),
    (["--rdzv-conf", "join_timeout"], "not key=value"),
    (["--rdzv-endpoint", "a:b:c"], "not HOST[:PORT]"),
])
def test_bad_values_are_refused_with_a_hint(tmp_path, argv, words):
    with pytest.raises(RingtrainError, match="HINT") as error:
        plan(tmp_path, *argv)
    assert words in str(error.value)


def test_pass_through_flags_reach_torchruns_agent(tmp_path):
    p = plan(tmp_path, "-r", "3", "--tee=0:1", "--role", "trainer", "--monitor-interval", "0.5",
             "--local-ranks-filter", "0", "--virtual-local-rank", "--shutdown-timeout", "9")
    args = agent.torchrun_args(p, 1)
    assert (args.redirects, args.tee, args.role, args.monitor_interval) == ("3", "0:1", "trainer", 0.5)
    assert (args.local_ranks_filter, args.virtual_local_rank, args.shutdown_timeout) == ("0", True, 9)


def test_no_python_executes_a_program(tmp_path):
    p = plans.plan_from_args(run.build_parser().parse_args(["--no-python", sys.executable, "-c", "print(1)"]))
    args = agent.torchrun_args(p, 1)
    assert p.no_python and args.training_script_args[:2] == ["exec", "none"]
    assert args.training_script_args[3:] == [sys.executable, "-c", "print(1)"]
    with pytest.raises(RingtrainError, match="neither an executable"):
        plans.plan_from_args(run.build_parser().parse_args(["--no-python", str(tmp_path / "nothing.sh")]))
    with pytest.raises(RingtrainError, match="--no-python with -m"):
        plans.plan_from_args(run.build_parser().parse_args(["--no-python", "-m", "timeit"]))


@pytest.mark.timeout(200)
def test_a_program_runs_with_its_output_teed_into_the_log_dir(tmp_path):
    # torchrun --no-python --tee 3 --log-dir DIR --nproc-per-node 2 sh -c '...': a shell, not Python
    from _launch_util import outputs, run_ringtrain

    logs = tmp_path / "logs"
    proc = run_ringtrain("run", "--no-python", "--tee", "3", "--log-dir", str(logs), "--nproc-per-node", "2",
                         "sh", "-c", 'echo "RESULT rank=$RANK world=$WORLD_SIZE"', timeout=150)
    assert proc.returncode == 0, outputs(proc)
    shown = sorted(line for line in proc.stdout.splitlines() if "RESULT" in line)
    assert shown == ["[default0]:RESULT rank=0 world=2", "[default1]:RESULT rank=1 world=2"], outputs(proc)  # as torchrun
    teed = sorted(p.read_text().strip() for p in logs.rglob("stdout.log"))
    assert teed == ["RESULT rank=0 world=2", "RESULT rank=1 world=2"], list(logs.rglob("*"))
