"""`ringtrain run` when things go wrong: dead peers, a killed launcher, what listens, elastic ranges.

Real processes through the real CLI, on 127.0.0.1 only. The restart-and-resume proof is in
tests/test_faults.py.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import _fault_jobs as jobs
import pytest
from _launch_util import (
    ALLREDUCE,
    FAILS_AT_STEP_3_ONCE,
    HELPERS,
    child_env,
    free_port,
    outputs,
    results,
    ringtrain_cmd,
    run_ringtrain,
    two_nodes,
    write,
)

from ringtrain.launcher import agent, plan as plans, run


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def _leftovers(marker: str) -> str:
    return subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout.strip()


STUCK_PEER = """
    import os, subprocess, sys, time
    import torch, torch.distributed as dist

    dist.init_process_group("gloo")
    here = os.path.dirname(os.path.abspath(__file__))
    if dist.get_rank() == 0:
        # A grandchild too (as a data-loading helper would be): it must not outlive the job.
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", here])
        open(os.path.join(here, "rank0.waiting"), "w").close()
        dist.all_reduce(torch.ones(1))  # rank 1 never joins: only the launcher can end this
        time.sleep(120)
    else:
        while not os.path.exists(os.path.join(here, "rank0.waiting")):
            time.sleep(0.05)
        time.sleep(0.5)  # rank 0 is inside its all_reduce by now
        open(os.path.join(here, "rank1.raised"), "w").write(repr(time.time()))
        raise ValueError("boom from rank one")
"""


@pytest.mark.timeout(90)
def test_rank_raising_while_its_peer_waits_in_a_collective(tmp_path):
    marker = f"ringtrain_stuck_marker_{time.time_ns()}"
    script = write(tmp_path / marker / "train.py", STUCK_PEER)
    proc = run_ringtrain("run", "--nproc-per-node", "2", str(script), timeout=75)
    ended = time.time()
    assert proc.returncode == 1, outputs(proc)
    # From the raise to the launcher's exit (the start-up before it says nothing here, and takes 30 s on a
    # loaded machine): seconds, not Gloo's 30-minute collective timeout.
    raised = float((script.parent / "rank1.raised").read_text())
    assert ended - raised < 20, outputs(proc)
    report = proc.stderr[proc.stderr.index("ringtrain run: worker rank"):]
    first_line = report.splitlines()[0]
    assert first_line.startswith("ringtrain run: worker rank 1 failed first (local rank 1 on node 0"), outputs(proc)
    assert f"host {socket.gethostname()}," in first_line, first_line
    assert "ValueError: boom from rank one" in report and "HINT:" in report, outputs(proc)
    assert "rank 0 (" in report  # listed among the ranks stopped because of it
    # Workers and the grandchild are gone: `ps` shows nothing started from that folder.
    _wait_for(lambda: _leftovers(marker) == "", 10, f"processes to end:\n{_leftovers(marker)}")


SLEEPER = """
    import os, time
    import torch.distributed as dist

    dist.init_process_group("gloo")
    open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{dist.get_rank()}.ready"), "w").close()
    time.sleep(120)
"""


@pytest.mark.timeout(90)
def test_killing_the_launcher_takes_its_workers_along(tmp_path):
    # torchrun gives every worker a session of its own, so nothing else would stop them.
    marker = f"ringtrain_orphan_marker_{time.time_ns()}"
    folder = tmp_path / marker
    script = write(folder / "train.py", SLEEPER)
    launcher = subprocess.Popen(ringtrain_cmd("run", "--nproc-per-node", "2", str(script)), env=child_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        _wait_for(lambda: len(list(folder.glob("*.ready"))) == 2, 60, "both workers to start")
        workers = jobs.descendants(launcher.pid)
        assert len(workers) >= 2
        launcher.kill()  # SIGKILL: the launcher gets no chance to stop anyone
        launcher.wait(10)
        _wait_for(lambda: _leftovers(marker) == "", 10, f"the workers to die:\n{_leftovers(marker)}")
    finally:
        launcher.kill()
        for pid in workers:  # left only if the test failed; never leak them into the next test
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie is dead
    except OSError:
        return False


@pytest.mark.timeout(90)
def test_killing_a_process_that_called_launch_takes_its_ranks_along(tmp_path):
    # A notebook kernel or test runner killed while ringtrain.launch(...) runs, its ranks
    # blocked in a collective (where the SIGINT torch's spawn arranges is never acted on).
    tests = HELPERS
    code = (f"import sys; sys.path.insert(0, {tests!r}); import _fault_jobs, ringtrain; "
            f"ringtrain.launch(_fault_jobs.blocked_in_recv, 2, args=({str(tmp_path)!r},), timeout=120)")
    driver = subprocess.Popen([sys.executable, "-c", code], env=child_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids: list[int] = []
    try:
        _wait_for(lambda: len(list(tmp_path.glob("*.pid"))) == 2, 60, "both ranks to start")
        pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
        driver.kill()
        driver.wait(10)
        _wait_for(lambda: not any(map(_alive, pids)), 10, f"ranks {pids} to die")
        assert len(pids) == 2 and not any(map(_alive, pids))
    finally:
        driver.kill()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


LISTENER = """
    import os, sys, time
    import torch, torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)  # Gloo's pairs are connected: everything the job listens on is open
    here = os.path.dirname(os.path.abspath(__file__))
    sys.stdout.write(f"RESULT rank={dist.get_rank()} gloo_ifname={os.environ.get('GLOO_SOCKET_IFNAME')}\\n")
    sys.stdout.flush()
    open(os.path.join(here, f"{dist.get_rank()}.ready"), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(here, "stop")) and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.barrier()
    dist.destroy_process_group()
"""


@pytest.mark.timeout(90)
def test_single_node_job_listens_on_loopback_only(tmp_path):
    script = write(tmp_path / "train.py", LISTENER)
    env = child_env()
    env.pop("GLOO_SOCKET_IFNAME", None)  # what a user's shell has: the launcher's own choice counts
    launcher = subprocess.Popen(ringtrain_cmd("run", "--nproc-per-node", "2", str(script)), env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: len(list(tmp_path.glob("*.ready"))) == 2 or launcher.poll() is not None, 60, "the job")
        pids = jobs.descendants(launcher.pid) | {launcher.pid}
        listening = jobs.listening(jobs.socket_inodes(pids))
        (tmp_path / "stop").touch()
        out, err = launcher.communicate(timeout=45)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, f"{out}\n{err}"
    # At least the job's store and each worker's Gloo listener, all on loopback.
    assert len(listening) >= 3, listening
    assert all(addr.rsplit(":", 1)[0] in ("127.0.0.1", "::1", "::ffff:127.0.0.1") for addr in listening), listening
    assert [r["gloo_ifname"] for r in results(out)] == ["lo", "lo"], out


DIES_ONCE = """
    import os, signal, sys, time
    import torch, torch.distributed as dist

    dist.init_process_group("gloo")
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    if attempt == "0" and dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)
    sys.stdout.write(f"RESULT rank={dist.get_rank()} world={dist.get_world_size()} attempt={attempt} sum={t.item()} "
                     f"port={os.environ['MASTER_PORT']}\\n")
    dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_elastic_range_runs_on_one_node_and_restarts(tmp_path):
    # --nnodes 1:2 goes to torchrun's c10d rendezvous; one node is enough to start, and a
    # worker killed in the first attempt is restarted with a clean store (torch 2.13's
    # shared store fails this restart: "connectFullMesh failed ... Connection refused").
    script = write(tmp_path / "train.py", DIES_ONCE)
    proc = run_ringtrain("run", "--nnodes", "1:2", "--nproc-per-node", "2", "--max-restarts", "1",
                         "--master-port", str(free_port()), "--timeout", "4", str(script), timeout=100)
    assert proc.returncode == 0, outputs(proc)
    rows = results(proc.stdout)
    assert [(r["rank"], r["world"], r["attempt"], r["sum"]) for r in rows] == [
        ("0", "2", "1", "6.0"), ("1", "2", "1", "6.0")], outputs(proc)


@pytest.mark.timeout(120)
def test_two_nodes_restart_together_with_a_fresh_store(tmp_path):
    # Rank 1 (node 1) dies in the first attempt; rank 0 (node 0) loses its peer mid-collective.
    # Both agents restart; node 0 hosts the second attempt's store on a new port and node 1
    # learns it through the rendezvous store.
    script = write(tmp_path / "train.py", DIES_ONCE)
    port = str(free_port())
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--master-port", port, "--max-restarts", "1", "--timeout", "30"]
    codes, outs, report = two_nodes(lambda rank: ["run", *common, "--node-rank", str(rank), str(script)], child_env())
    assert codes == [0, 0], report
    rows = results(outs[0][0]) + results(outs[1][0])
    assert [(r["rank"], r["world"], r["attempt"], r["sum"]) for r in rows] == [
        ("0", "2", "1", "6.0"), ("1", "2", "1", "6.0")], report
    assert rows[0]["port"] == rows[1]["port"] != port, report  # a new store for the new attempt


def test_the_step_table_after_a_restart_is_the_last_attempts(tmp_path):
    # The restarted workers meet in a store of their own (rendezvous.py): the table is read from there,
    # not from the first attempt's (which said 3 steps).
    script = write(tmp_path / "train.py", FAILS_AT_STEP_3_ONCE)
    proc = run_ringtrain("run", "--nproc-per-node", "2", "--max-restarts", "1", str(script), timeout=100)
    assert proc.returncode == 0, outputs(proc)
    table = proc.stderr[proc.stderr.index("ringtrain: per-rank step times"):].splitlines()
    assert [row.split()[:2] for row in table[2:4]] == [["0", "50"], ["1", "50"]], outputs(proc)


KILLED_WHILE_RECORDING = """
import json, os, signal, sys, traceback
from ringtrain.liveness import failures  # what the worker entry writes the error file with

def dump(data, f):  # the agent's SIGTERM arrives in the middle of the write
    f.write(json.dumps(data)[:10])
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)

failures.json.dump = dump
try:
    raise ValueError("boom")
except ValueError as e:
    failures.write_error_file(os.environ["TORCHELASTIC_ERROR_FILE"], "ValueError: boom", traceback.format_exc())
"""


def test_error_file_is_whole_or_absent_when_the_worker_is_stopped_while_writing_it(tmp_path):
    # The agent parses the error files of the workers it stopped; a half-written one made it
    # die with JSONDecodeError instead of reporting (or restarting) the job.
    error_file = tmp_path / "error.json"
    env = dict(os.environ, TORCHELASTIC_ERROR_FILE=str(error_file))
    proc = subprocess.run([sys.executable, "-c", KILLED_WHILE_RECORDING], env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not error_file.exists()  # absent: the agent reports "killed by signal", no parse error
    # Uninterrupted, it is the JSON torchelastic's ProcessFailure reads.
    proc = subprocess.run([sys.executable, "-c", KILLED_WHILE_RECORDING.replace("failures.json.dump = dump", "")],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(error_file))
    assert failure.message["message"] == "ValueError: boom"
    assert "ValueError: boom" in failure.message["extraInfo"]["py_callstack"]


def _plan(tmp_path, *argv):
    script = write(tmp_path / "train.py", ALLREDUCE)
    return plans.plan_from_args(run.build_parser().parse_args([*argv, str(script), "--log", "x", "--master", "y", "--nnodes=9"]))


def test_script_arguments_never_go_through_torchruns_parser(tmp_path):
    # torchrun's argparse would take "--log" for an ambiguous abbreviation of its --log-dir /
    # --logs-specs and stop the job; "--nnodes=9" must not reach it either.
    plan = _plan(tmp_path, "--nproc-per-node", "2")
    args = agent.torchrun_args(plan, 1234)
    assert args.training_script == agent.WORKER
    assert args.training_script_args[:2] == ["path", "none"] and args.training_script_args[2].isdigit()
    assert args.training_script_args[3:] == [plan.target, "--log", "x", "--master", "y", "--nnodes=9"]
    assert (args.nnodes, args.nproc_per_node, args.max_restarts) == ("1", "2", 0)


def test_fixed_node_counts_use_the_fresh_store_rendezvous(tmp_path):
    static = agent.torchrun_args(_plan(tmp_path, "--nnodes", "2", "--node-rank", "1", "--master-addr", "::1"), 29400)
    assert (static.rdzv_backend, static.rdzv_endpoint) == ("ringtrain", "[::1]:29400")
    assert "rank=1" in static.rdzv_conf and "timeout=300" in static.rdzv_conf
    elastic = agent.torchrun_args(_plan(tmp_path, "--nnodes", "1:2"), 29400)
    assert (elastic.rdzv_backend, elastic.rdzv_endpoint) == ("ringtrain-c10d", "127.0.0.1:29400")


def test_manual_states_the_security_and_elastic_rules(capsys):
    with pytest.raises(SystemExit):
        run.main(["--help"])
    manual = " ".join(capsys.readouterr().out.split())
    assert "no authentication" in manual and "trusted network" in manual
    assert "127.0.0.1" in manual and "GLOO_SOCKET_IFNAME" in manual
    assert "world size changes" in manual  # what a restart with a different world size keeps


STARTS_A_HELPER_THEN_FAILS = """
    import os, signal, subprocess, sys, time

    here = os.path.dirname(os.path.abspath(__file__))
    # A helper the script starts itself (a data server, a logger): it holds the launcher's
    # stdout and stderr, so while it lives a caller reading them waits.
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", here])
    open(os.path.join(here, f"{os.environ['RANK']}.started"), "w").close()
    if os.environ["RANK"] == "1":
        while not os.path.exists(os.path.join(here, "0.started")):
            time.sleep(0.05)
        if sys.argv[1] == "raise":
            raise ValueError("boom from rank one")
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["raise", "sigkill"])
def test_what_a_failed_worker_started_ends_with_the_job(tmp_path, how):
    # Found by CI: a worker that ended by itself was not stopped by torchrun's agent, so the
    # helper it had started lived on with the launcher's pipes, and the caller waited for it.
    marker = f"ringtrain_helper_marker_{time.time_ns()}"
    script = write(tmp_path / marker / "train.py", STARTS_A_HELPER_THEN_FAILS)
    start = time.monotonic()
    proc = run_ringtrain("run", "--nproc-per-node", "2", str(script), how, timeout=60)  # reads both pipes to EOF
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, outputs(proc)
    assert elapsed < 30, outputs(proc)
    assert "ringtrain run: worker rank 1 failed first" in proc.stderr, outputs(proc)
    _wait_for(lambda: _leftovers(marker) == "", 10, f"processes to end:\n{_leftovers(marker)}")


SAVE_INTO_A_MISSING_FOLDER = """
import torch, ringtrain as rt
ring = rt.Ring(strategy="ddp", seed=0)
model = ring.setup(torch.nn.Linear(4, 2))
ring.save("nowhere/ckpt.pt", model=model)   # rank 0 cannot write it; every rank raises rank 0's error
"""


@pytest.mark.timeout(300)
def test_a_save_that_fails_on_rank_0_is_blamed_on_rank_0_every_time(tmp_path):
    """A failure every rank raises for what happened on rank 0 (its write of ring.save) named rank 1 as the cause in
    about one run of three: rank 1 posted it as its own first. Now the others post it as rank 0's."""
    script = write(tmp_path / "train.py", SAVE_INTO_A_MISSING_FOLDER)
    for _ in range(3):
        proc = run_ringtrain("run", "--nproc-per-node", "2", str(script), cwd=tmp_path)
        assert proc.returncode == 1, outputs(proc)
        assert "worker rank 0 failed first" in proc.stderr, outputs(proc)
        assert "rank 1 stopped because rank 0 failed" in proc.stderr and "rank 0 stopped because" not in proc.stderr
