"""What `ringtrain run` prints around a job, as a newcomer sees it (issue 33, items 5 and 7): real launches,
with OMP_NUM_THREADS unset (the tests' usual environment sets it to 1, which hides both the banner and the
threads question).

* no torchrun banner about OMP_NUM_THREADS; the ranks on one machine share its cores (two one-worker "nodes"
  on one machine each ran every core's threads: 233 ms a step against 19 ms);
* Ctrl-C: one line per rank and the launcher's summary, no KeyboardInterrupt tracebacks;
* a restart: the failing rank's traceback, not the waiting rank's 15 lines of Gloo.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time

import pytest
from _launch_util import (
    FAILS_AT_STEP_3_ONCE,
    PREEMPTIBLE,
    child_env,
    free_port,
    outputs,
    preempted_by,
    results,
    ringtrain_cmd,
    run_ringtrain,
    two_nodes,
    write,
)

from ringtrain.launcher import env_info

pytestmark = pytest.mark.timeout(150)

BANNER = "Setting OMP_NUM_THREADS environment variable"

THREADS = """
    import os, sys, torch
    sys.stdout.write(f"RESULT rank={os.environ['RANK']} omp={os.environ.get('OMP_NUM_THREADS')} "
                     f"threads={torch.get_num_threads()}\\n")
"""


def _env(**extra: str) -> dict[str, str]:
    env = child_env()
    env.pop("OMP_NUM_THREADS", None)
    return {**env, **extra}


def _shared() -> str:
    return str(max(1, env_info.usable_cpus() // 2))


def test_two_workers_share_the_cores_without_torchruns_banner(tmp_path):
    proc = run_ringtrain("run", "--nproc-per-node", "2", str(write(tmp_path / "t.py", THREADS)), env=_env(),
                         timeout=120)
    assert proc.returncode == 0, outputs(proc)
    assert BANNER not in proc.stderr, outputs(proc)
    assert [(r["omp"], r["threads"]) for r in results(proc.stdout)] == [(_shared(), _shared())] * 2, outputs(proc)


def test_the_users_own_thread_count_stands(tmp_path):
    proc = run_ringtrain("run", "--nproc-per-node", "2", str(write(tmp_path / "t.py", THREADS)),
                         env=_env(OMP_NUM_THREADS="3"), timeout=120)
    assert proc.returncode == 0, outputs(proc)
    assert [r["omp"] for r in results(proc.stdout)] == ["3", "3"], outputs(proc)


def test_two_nodes_on_one_machine_share_its_cores(tmp_path):
    # docs/launching.md's "two nodes, tried on one machine": one command (-H), and two terminals.
    script = str(write(tmp_path / "t.py", THREADS))
    together = run_ringtrain("run", "-np", "2", "-H", "localhost:1,127.0.0.1:1", script, env=_env(), timeout=120)
    assert together.returncode == 0, outputs(together)
    assert [r["threads"] for r in results(together.stdout)] == [_shared()] * 2, outputs(together)
    port = str(free_port())
    codes, outs, report = two_nodes(lambda rank: ["run", "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node",
                                                  "1", "--master-addr", "127.0.0.1", "--master-port", port, script],
                                    _env())
    assert codes == [0, 0], report
    assert [r["threads"] for r in results(outs[0][0] + outs[1][0])] == [_shared()] * 2, report
    assert BANNER not in outs[0][1] + outs[1][1], report


WAITS = """
    import os, time
    import ringtrain as rt

    ring = rt.Ring(strategy="ddp", seed=0)
    open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"ready.{ring.rank}"), "w").close()
    while True:
        time.sleep(0.05)
"""


def test_ctrl_c_says_one_line_per_rank_and_no_traceback(tmp_path):
    script = write(tmp_path / "train.py", WAITS)
    proc = subprocess.Popen(ringtrain_cmd("run", "--nproc-per-node", "2", str(script)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())
    deadline = time.monotonic() + 100
    while not all((tmp_path / f"ready.{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C sends the launcher (torchrun passes it on)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    said = f"--- exit {proc.returncode}\n{out}\n{err}"
    assert proc.returncode == 128 + signal.SIGINT, said
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, said
    for rank in (0, 1):
        assert err.count(f"ringtrain: rank {rank} interrupted (SIGINT) in train.py:") == 1, said
    assert "stopped by SIGINT" in err.splitlines()[-1], said
    assert "death signal" not in err and "closing signal" not in err, said  # torchelastic's own lines, said better




def test_a_restart_shows_the_failing_ranks_traceback_only(tmp_path):
    script = str(write(tmp_path / "t.py", FAILS_AT_STEP_3_ONCE))
    proc = run_ringtrain("run", "--nproc-per-node", "2", "--max-restarts", "1", script,
                         env=_env(), timeout=120)
    assert proc.returncode == 0, outputs(proc)
    assert proc.stderr.count("Traceback") == 1 and "ValueError: the first attempt fails at step 3" in proc.stderr, \
        outputs(proc)
    # the per-rank table is the last attempt's: it says so, not as the run's whole
    assert "(the last of 2 attempts only" in proc.stderr, outputs(proc)
    # rank 0, waiting in its all-reduce, says at most one line naming the cause (when torchrun's agent has not
    # stopped it first), never Gloo's traceback
    assert "Connection closed by peer" not in proc.stderr and "[rank0]:" not in proc.stderr, outputs(proc)


WAITS_IN_A_COLLECTIVE = """
import os, time
import ringtrain as rt

ring = rt.Ring(strategy="ddp", seed=0)
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"ready.{ring.rank}"), "w").close()
if ring.rank == 0:
    ring.barrier()  # rank 1 never comes: rank 0 waits inside ringtrain's own code
while True:
    time.sleep(0.05)
"""


def test_ctrl_c_inside_ringtrains_own_code_names_the_users_line(tmp_path):
    script = write(tmp_path / "train.py", WAITS_IN_A_COLLECTIVE)
    proc = subprocess.Popen(ringtrain_cmd("run", "--nproc-per-node", "2", str(script)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())
    deadline = time.monotonic() + 100
    while not all((tmp_path / f"ready.{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # rank 0 is in the barrier by now (it wrote its mark just before)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    said = f"--- exit {proc.returncode}\n{out}\n{err}"
    assert "ringtrain: rank 0 interrupted (SIGINT) in train.py:8" in err, said  # the barrier line


RANK_1_RAISES = """
    import ringtrain as rt
    ring = rt.Ring(seed=0)
    ring.barrier()
    if ring.rank == 1:
        raise ValueError("rank 1 fails here")
    ring.barrier()
"""


def test_a_failure_is_reported_without_torchelastics_own_line(tmp_path):
    # torchelastic's "E1202 ... api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: ...) of binary: ..." said
    # what the report's first line says, in its words; --verbose keeps it.
    script = str(write(tmp_path / "t.py", RANK_1_RAISES))
    proc = run_ringtrain("run", "--nproc-per-node", "2", script, env=_env(), timeout=120)
    assert proc.returncode == 1, outputs(proc)
    assert "worker rank 1 failed first" in proc.stderr, outputs(proc)
    assert "failed (exitcode:" not in proc.stderr and "api.py" not in proc.stderr, outputs(proc)
    verbose = run_ringtrain("run", "--verbose", "--nproc-per-node", "2", script, env=_env(), timeout=120)
    assert verbose.returncode == 1 and "failed (exitcode: 1)" in verbose.stderr, outputs(verbose)


RETURNS_A_VIEW = """
    import torch
    import ringtrain as rt

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))

        def forward(self, x):
            return self.mlp(x)[:, :2]  # a view, as nanoGPT's logits[:, [-1], :]

    ring = rt.Ring(strategy=STRATEGY, seed=0)
    model = Head()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ring.backward(model(torch.randn(2, 4)).sum())
    optimizer.step()
"""


@pytest.mark.parametrize("strategy", ["'fsdp'", "rt.strategies.DDP(tp=2)"])  # fully_shard, and replicate under TP
def test_fsdps_view_warning_is_said_once_per_job_not_once_per_rank(tmp_path, strategy):
    script = write(tmp_path / "t.py", RETURNS_A_VIEW.replace("STRATEGY", strategy))
    proc = run_ringtrain("run", "--nproc-per-node", "2", str(script), env=_env(), timeout=120)
    assert proc.returncode == 0, outputs(proc)
    said = re.findall(r"FSDP2-wrapped module \((\w+)\) returned a view tensor", proc.stderr)
    # once per module that returned one (under TP its row-wise Linear's output is a view too), not once per rank
    assert len(said) == len(set(said)) and {"ReplicateHead", "FSDPHead"} & set(said), outputs(proc)


def test_a_preemption_says_got_sigterm_once_for_the_node_not_once_per_rank(tmp_path):
    # ringtrain run passes the SIGTERM to every worker: each printed "ringtrain: got SIGTERM: finishing this step",
    # the same line twice with no rank named.
    first, _ = preempted_by(ringtrain_cmd("run", "--nproc-per-node", "2", str(write(tmp_path / "t.py", PREEMPTIBLE))),
                            signal.SIGTERM, tmp_path, _env())
    assert first.returncode == 75, outputs(first)
    assert first.stderr.count("got SIGTERM: finishing this step") == 1, outputs(first)
    assert "got SIGTERM: finishing this step, then a checkpoint and exit 75 (preempted); every rank of this node got it" \
        in first.stderr, outputs(first)


def test_a_failing_ranks_traceback_is_printed_once(tmp_path):
    # The rank printed its traceback as it failed, and the report printed it again ("Traceback from rank 1:").
    script = str(write(tmp_path / "t.py", RANK_1_RAISES))
    proc = run_ringtrain("run", "--nproc-per-node", "2", script, env=_env(), timeout=120)
    assert proc.returncode == 1, outputs(proc)
    assert proc.stderr.count("Traceback (most recent call last)") == 1, outputs(proc)
    report = proc.stderr[proc.stderr.index("ringtrain run: worker rank 1 failed first"):]
    # where it ended, not the traceback again: the user's line and the exception
    assert "Traceback from rank 1: above, in rank 1's own lines; it ended:\n  File " in report, outputs(proc)
    assert 't.py", line 6, in <module>' in report and "ValueError: rank 1 fails here" in report, outputs(proc)
    # with rank 1's stderr in files only, the report is where it shows
    logs = tmp_path / "logs"
    proc = run_ringtrain("run", "--nproc-per-node", "2", "--log-dir", str(logs), "--redirects", "2", script,
                         env=_env(), timeout=120)
    assert proc.returncode == 1 and proc.stderr.count("Traceback (most recent call last)") == 1, outputs(proc)
    assert "Traceback from rank 1:\n" in proc.stderr and "ValueError: rank 1 fails here" in proc.stderr, outputs(proc)
