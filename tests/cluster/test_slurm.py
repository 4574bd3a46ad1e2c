"""Slurm for real (issue 32, item 3): srun tasks, sbatch of examples/cluster/'s scripts (one node; two nodes of
`ringtrain run` agents), a failing rank, and one `ringtrain run` agent under srun, on the session's cluster of this host
(conftest.py, scripts/one_node_slurm.sh). Every job must train what one process trains (to TOLERANCE). `make test`
runs the unmarked ones where Slurm is installed (about 35 s on 2 idle cores); the `cluster` marker's, and preemption
and requeue (test_slurm_preempt.py), run in `make test-cluster`."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from _cluster import EPOCHS, REPO, Slurm, assert_close_to, final_parameters, outputs

pytestmark = pytest.mark.timeout(300)

TRAIN = "examples/cluster/train.py"


def _ranks(text: str, launcher: str) -> list[tuple[str, str]]:
    # Not anchored: print() writes the text and its newline apart, so ranks sharing one stream (a `ringtrain run`
    # agent's workers) can leave "...started by torchelasticrank 0 of 2, ..." (seen 2 runs in 7)
    return sorted(re.findall(rf"rank (\d+) of 2, node (\d+), started by {launcher}", text))


def _batch(slurm: Slurm, script: str, *args: str, folder: Path, env: dict | None = None) -> tuple[int, str, dict]:
    """``sbatch examples/cluster/<script> ARGS`` until the job ends (polled: ``sbatch --wait`` checks every 10 s):
    its id, its output file's text, its fields."""
    job = slurm.sbatch(script, *args, output=folder / "slurm-%j.out", env=env)
    fields = slurm.finished(job, timeout=240)
    return job, (folder / f"slurm-{job}.out").read_text(), fields


def test_srun_tasks_are_slurm_ranks_and_train_as_one_process(slurm, one_process, tmp_path, measured):
    proc = slurm.run("srun", "-N1", "-n2", "python", TRAIN, "--out", str(tmp_path), "--epochs", str(EPOCHS))
    assert proc.returncode == 0, outputs(proc)
    assert _ranks(proc.stdout, "slurm") == [("0", "0"), ("1", "0")], outputs(proc)
    worst = assert_close_to(final_parameters(tmp_path), one_process)
    measured(f"srun -N1 -n2 python train.py: environment slurm, parameters within {worst:.1e} of one process")


def test_sbatch_of_the_one_node_script_trains_into_its_output_file(slurm, one_process, tmp_path):
    job, text, fields = _batch(slurm, "one_node.sbatch", "--out", str(tmp_path / "run"), "--epochs", str(EPOCHS),
                               folder=tmp_path)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), f"{fields}\n{text}"
    assert re.search(rf"^job {job} on \S+, restart 0$", text, re.M), text
    assert _ranks(text, "slurm") == [("0", "0"), ("1", "0")], text
    assert f"done: {EPOCHS * 64} steps on 2 process(es), slurm" in text, text
    assert_close_to(final_parameters(tmp_path / "run"), one_process)


def test_a_rank_that_raises_under_srun_ends_the_job_in_seconds_naming_it(slurm, tmp_path, measured):
    # 1000 epochs would take minutes: the job ends because rank 1 raised at step 3, and says so.
    argv = ["srun", "-N1", "-n2", "python", TRAIN, "--out", str(tmp_path), "--epochs", "1000", "--crash-rank", "1",
            "--crash-at", "3"]
    with open(tmp_path / "stdout", "w") as stdout:
        proc = subprocess.Popen(argv, cwd=REPO, env=slurm.env(), stdout=stdout, stderr=subprocess.PIPE, text=True)
        lines, raised = [], None
        try:
            for line in proc.stderr:  # ends when every task and srun have closed it
                lines.append(line)
                if raised is None and "crashes at step 3" in line:
                    raised = time.monotonic()
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    ended = time.monotonic()
    err = "".join(lines)
    assert proc.returncode != 0 and raised is not None, err
    # "stops:" from its watchdog (rank 0 was computing), "stopped because" when its collective failed first
    assert re.search(r"ringtrain: rank 0 (stops:|stopped because) rank 1 failed \(RuntimeError: rank 1 crashes at "
                     r"step 3", err), err
    assert re.search(r"srun: error: \S+: task 1: Exited with exit code 1", err), err
    assert not (tmp_path / "final.pt").exists()
    assert ended - raised < 30, f"the job went on {ended - raised:.1f} s after rank 1 raised\n{err}"
    measured(f"srun, rank 1 raises: the job ended {ended - raised:.2f} s after its traceback, rank 0 naming rank 1")


def test_srun_of_one_ringtrain_run_agent_per_node_trains_as_one_process(slurm, one_process, tmp_path):
    proc = slurm.run("srun", "-N1", "-n1", "ringtrain", "run", "--nproc-per-node", "2", TRAIN, "--out", str(tmp_path),
                     "--epochs", str(EPOCHS))
    assert proc.returncode == 0, outputs(proc)
    assert _ranks(proc.stdout, "torchelastic") == [("0", "0"), ("1", "0")], outputs(proc)
    assert_close_to(final_parameters(tmp_path), one_process)


@pytest.mark.cluster  # `make test-cluster` only: `make test` has a budget
def test_sbatch_of_the_two_node_script_trains_as_one_process(slurm, one_process, tmp_path):
    if slurm.nodes < 2:
        pytest.skip("the cluster has one node: this host's name does not resolve, or is localhost")
    _, text, fields = _batch(slurm, "two_nodes.sbatch", "--out", str(tmp_path / "run"), "--epochs", str(EPOCHS),
                             folder=tmp_path, env=slurm.env(NPROC_PER_NODE="1"))
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), f"{fields}\n{text}"
    assert _ranks(text, "torchelastic") == [("0", "0"), ("1", "1")], text  # one worker on each node
    assert_close_to(final_parameters(tmp_path / "run"), one_process)


@pytest.mark.cluster  # `make test-cluster` only: `make test` has a budget
def test_python_in_the_batch_script_itself_is_refused_at_once_naming_srun(slurm, tmp_path):
    # Without srun the batch shell is SLURM_PROCID 0 of SLURM_NTASKS=2: it used to wait for a rank 1 for 30 minutes.
    job = slurm.sbatch_wrap("-n2", f"python {TRAIN} --out {tmp_path}", output=tmp_path / "slurm-%j.out")
    fields = slurm.finished(job, timeout=120)
    text = (tmp_path / f"slurm-{job}.out").read_text()
    assert (fields["JobState"], fields["ExitCode"]) == ("FAILED", "1:0"), f"{fields}\n{text}"
    assert f"runs in Slurm job {job}'s batch script itself, not as one of srun's tasks" in text, text
    assert "HINT: start it with srun (`srun python train.py`" in text, text
