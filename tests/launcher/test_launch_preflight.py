"""What this machine cannot run is refused before anything starts; too many workers per core get a warning.

Real `ringtrain run` processes for what users see; ``env_info``'s detection functions are the
only thing replaced, to play a machine with other cores or GPUs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest
from _launch_util import ALLREDUCE, child_env, free_port, outputs, ringtrain_cmd, run_ringtrain, write

from ringtrain.errors import RingtrainError
from ringtrain.launcher import env_info, plan as plans, preflight, run
from ringtrain.launcher.ports import is_this_machine
from ringtrain.parallel import devices

pytestmark = pytest.mark.timeout(120)


def _refusal(proc: subprocess.CompletedProcess) -> str:
    """The launcher's refusal (exit 2, a HINT, no traceback, no worker ran): its stderr."""
    assert proc.returncode == 2, outputs(proc)
    assert "\nHINT: " in proc.stderr and "Traceback" not in proc.stderr and "RESULT" not in proc.stdout, outputs(proc)
    return proc.stderr


@pytest.mark.parametrize("count", ["99999999999999999999", "100000", "1:100000"])
def test_impossible_node_counts_are_refused(tmp_path, count):
    proc = run_ringtrain("run", "--nnodes", count, str(write(tmp_path / "train.py", ALLREDUCE)), timeout=60)
    assert f"--nnodes '{count}': more than 65,536 nodes" in _refusal(proc), outputs(proc)


def test_world_sizes_past_torchs_32_bit_ranks_are_refused(tmp_path):
    proc = run_ringtrain("run", "--nproc-per-node", "99999999999999999999", str(write(tmp_path / "t.py", ALLREDUCE)),
                         timeout=60)
    assert "more ranks than torch.distributed can number" in _refusal(proc), outputs(proc)


def test_node_0_refuses_a_master_addr_that_is_another_machine(tmp_path):
    script = str(write(tmp_path / "train.py", ALLREDUCE))
    start = time.monotonic()
    proc = run_ringtrain("run", "--nnodes", "2", "--master-addr", "192.0.2.1", script, timeout=60)  # TEST-NET-1
    said = _refusal(proc)
    assert "--master-addr 192.0.2.1 is not an address of this machine, but this is node 0" in said, outputs(proc)
    assert time.monotonic() - start < 60
    unresolved = run_ringtrain("run", "--nnodes", "2", "--master-addr", "node0.invalid", script, timeout=60)
    assert "--master-addr 'node0.invalid' does not resolve on this machine (node 0)" in _refusal(unresolved), \
        outputs(unresolved)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ulimit -n in a shell")
def test_node_0_refuses_more_nodes_than_its_open_files_allow(tmp_path):
    script = str(write(tmp_path / "train.py", ALLREDUCE))
    command = " ".join(ringtrain_cmd("run", "--nnodes", "100", "--master-port", str(free_port()), script))
    proc = subprocess.run(["bash", "-c", f"ulimit -n 256 && exec {command}"], capture_output=True, text=True,
                          timeout=60, env=child_env())
    said = _refusal(proc)
    assert "node 0 would need about 464 open files" in said and "only 256 (ulimit -n)" in said, outputs(proc)
    assert "ulimit -n 464" in said, outputs(proc)


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_more_than_four_workers_per_core_get_a_warning(tmp_path):
    # One usable core (taskset) and five workers. Node 1 of a job whose node 0 never comes: the
    # warning is printed before the rendezvous, and no worker starts.
    script = str(write(tmp_path / "train.py", ALLREDUCE))
    command = ringtrain_cmd("run", "--nproc-per-node", "5", "--nnodes", "2", "--node-rank", "1",
                            "--master-port", str(free_port()), "--timeout", "2", script)
    proc = subprocess.run(["taskset", "-c", "0", *command], capture_output=True, text=True, timeout=90, env=child_env())
    assert ("ringtrain run: warning: 5 workers on this node, but only 1 CPU core(s) are usable here: more than 4 per "
            "core") in proc.stderr, outputs(proc)
    assert "HINT: use --nproc-per-node 4 or fewer" in proc.stderr, outputs(proc)
    assert proc.returncode == 1 and "RESULT" not in proc.stdout, outputs(proc)  # node 0 never came


def _plan(tmp_path, *args: str) -> run.Plan:
    script = write(tmp_path / "train.py", ALLREDUCE)
    return plans.plan_from_args(run.build_parser().parse_args([*args, str(script)]))


def test_the_warning_counts_usable_cores_and_visible_gpus(tmp_path, monkeypatch):
    monkeypatch.setattr(env_info, "usable_cpus", lambda: 2)
    monkeypatch.setattr(devices, "visible_gpus", lambda: devices.Gpus(0))
    assert preflight.oversubscription(_plan(tmp_path, "--nproc-per-node", "8")) is None  # 4 per core: fine
    assert "9 workers on this node, but only 2 CPU core(s)" in preflight.oversubscription(
        _plan(tmp_path, "--nproc-per-node", "9"))
    for word in ("cpu", "auto"):  # counted from the machine: never too many
        assert preflight.oversubscription(_plan(tmp_path, "--nproc-per-node", word)) is None
    monkeypatch.setattr(env_info, "usable_cpus", lambda: 64)
    monkeypatch.setattr(devices, "visible_gpus", lambda: devices.Gpus(1))
    assert "5 workers on this node, and 1 GPU(s) visible" in preflight.oversubscription(
        _plan(tmp_path, "--nproc-per-node", "5"))
    assert preflight.oversubscription(_plan(tmp_path, "--nproc-per-node", "4")) is None
    assert preflight.check(_plan(tmp_path, "--nproc-per-node", "5"))[0].startswith("warning: 5 workers")


def test_only_node_0_of_a_fixed_size_job_must_be_the_master(tmp_path):
    elsewhere = ("--master-addr", "192.0.2.1")
    with pytest.raises(RingtrainError, match="not an address of this machine"):
        preflight.master_is_here(_plan(tmp_path, "--nnodes", "2", *elsewhere))
    preflight.master_is_here(_plan(tmp_path, "--nnodes", "2", "--node-rank", "1", *elsewhere))  # node 0 is there
    preflight.master_is_here(_plan(tmp_path, "--nnodes", "1:2", *elsewhere))  # elastic: whoever holds the address
    assert is_this_machine("127.0.0.1") and is_this_machine("localhost") and is_this_machine("[::1]")
    assert not is_this_machine("192.0.2.1")


def test_workers_share_the_cores_of_their_machine(tmp_path, monkeypatch):
    # Issue 33: two one-worker "nodes" on one 2-core machine each ran torch's default (every core), 233 ms a step
    # against 19 ms with one thread each. Unset OMP_NUM_THREADS: the usable cores over the ranks on this machine.
    monkeypatch.setattr(env_info, "usable_cpus", lambda: 8)
    share = preflight.threads_per_worker
    assert share(_plan(tmp_path, "--nproc-per-node", "2"), 2, environ={})[0] == 4
    assert share(_plan(tmp_path, "--nproc-per-node", "16"), 16, environ={})[0] == 1  # never 0
    nodes_here = _plan(tmp_path, "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--nproc-per-node", "1")
    assert share(nodes_here, 1, environ={}) == (4, "8 usable core(s) / 1 worker(s) x 2 nodes on this machine")
    assert share(_plan(tmp_path, "--nnodes", "1:4", "--nproc-per-node", "1"), 1, environ={})[0] == 2  # up to 4 here
    # A lone process keeps torch's default; nodes on other machines share nothing with this one; the user's own
    # setting stands.
    assert share(_plan(tmp_path, "--nproc-per-node", "1"), 1, environ={}) is None
    elsewhere = _plan(tmp_path, "--nnodes", "2", "--node-rank", "1", "--master-addr", "192.0.2.1", "--nproc-per-node", "1")
    assert share(elsewhere, 1, environ={}) is None
    assert share(_plan(tmp_path, "--nproc-per-node", "2"), 2, environ={"OMP_NUM_THREADS": "3"}) is None
