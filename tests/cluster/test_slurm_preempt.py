"""Preemption under Slurm for real (issue 32, item 3): ``scancel --signal=TERM`` at a random step of
examples/cluster/'s jobs, on the session's cluster of this host (conftest.py). The ring saves the step the job is at;
requeued (``--requeue``: ``scontrol requeue``) or submitted again after exit 75, the job resumes there and ends
bitwise equal to the same job never interrupted. About a minute: `make test-cluster` runs them (the ``cluster``
marker), `make test` does not."""

from __future__ import annotations

import random
import re
import time

import pytest
from _cluster import assert_bitwise, final_parameters, outputs

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

# The preemption jobs: long enough that a SIGTERM sent at a random early step lands mid-run (1280 steps, 2-4 ms each
# on 2 idle cores), saves only at a preemption (save_every above the run's length), and print every step.
LONG = ("--epochs", "20", "--save-every", "1000", "--log-every", "1")
LONG_STEPS = 20 * 64


@pytest.fixture(scope="module")
def uninterrupted(slurm, tmp_path_factory) -> dict:
    """The preemption jobs' run, never signalled: srun tasks of one_node.sbatch, 2 ranks."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    job = slurm.sbatch("one_node.sbatch", "--out", str(folder / "run"), "--checkpoint-dir", str(folder / "run" / "ckpt"),
                       "--requeue", *LONG, output=folder / "slurm-%j.out")
    fields = slurm.finished(job)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), \
        f"{fields}\n{(folder / f'slurm-{job}.out').read_text()[-3000:]}"
    return final_parameters(folder / "run")


def _signal_at_a_random_step(slurm, job: int, log, measured, what: str) -> tuple[int, float]:
    """Wait until the job's output shows a random step k, then ``scancel --signal=TERM``: (k, seconds from the
    signal until the job's state leaves RUNNING)."""
    k = random.randint(10, 300)
    deadline = time.monotonic() + 300
    # "step N epoch": rank 0's lines, not anchored (another rank's output may share their line: test_slurm._ranks)
    while not (log.exists() and re.search(rf"step {k} epoch ", log.read_text())):
        state = slurm.job(job).get("JobState")
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"job {job} is {state} before step {k}"
        assert time.monotonic() < deadline, f"job {job} did not reach step {k} in 300 s"
        time.sleep(0.02)
    signalled = time.monotonic()
    proc = slurm.run("scancel", "--signal=TERM", str(job), timeout=30)
    assert proc.returncode == 0, outputs(proc)
    left = slurm.wait(job, lambda f: f.get("JobState") != "RUNNING", timeout=120, poll=0.05)
    took = time.monotonic() - signalled
    measured(f"{what}: scancel --signal=TERM at step {k} -> job {left['JobState']} after {took:.2f} s")
    return k, took


def _saved_step(text: str, k: int) -> tuple[int, str]:
    found = re.search(r"ringtrain: preempted \(SIGTERM\) at step (\d+): checkpoint (\S+) written", text)
    assert found, text
    saved = int(found.group(1))
    assert k <= saved < LONG_STEPS, f"signalled at step {k}, saved step {saved} of {LONG_STEPS}"
    return saved, found.group(2)


def _resumed_at(text: str, saved: int, path: str) -> None:
    assert re.search(rf"ringtrain: resumed from {re.escape(path)} \(epoch \d+, step {saved}\)", text), text
    second = text[text.index("ringtrain: resumed from"):]
    assert re.search(r"step (\d+) epoch ", second).group(1) == str(saved + 1), second[:2000]
    assert f"done: {LONG_STEPS} steps on 2 process(es)" in second, second[-2000:]


def test_scancel_signal_term_saves_the_step_and_the_requeued_job_resumes_there_bitwise(slurm, uninterrupted,
                                                                                        tmp_path, measured):
    out = tmp_path / "run"
    job = slurm.sbatch("one_node.sbatch", "--out", str(out), "--checkpoint-dir", str(out / "ckpt"), "--requeue",
                       *LONG, output=tmp_path / "slurm-%j.out")
    log = tmp_path / f"slurm-{job}.out"
    k, _ = _signal_at_a_random_step(slurm, job, log, measured, "srun tasks, requeue=True")
    requeued = slurm.wait(job, lambda f: f.get("Restarts") == "1", timeout=60)
    assert requeued["JobState"] in ("PENDING", "REQUEUED", "CONFIGURING", "RUNNING", "COMPLETING"), requeued
    gone = time.monotonic()
    slurm.wait(job, lambda f: f.get("JobState") == "RUNNING" and f.get("Restarts") == "1", timeout=120, poll=0.1)
    measured(f"srun tasks, requeue=True: the requeued job ran again {time.monotonic() - gone:.1f} s later "
             "(cred_expire=5 + 1 s, then the next scheduling pass)")
    fields = slurm.finished(job)
    text = log.read_text()
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "1"), f"{fields}\n{text[-3000:]}"
    saved, path = _saved_step(text, k)
    assert text.count("got SIGTERM: finishing this step") == 2, text  # each rank noted it (srun: no agent)
    assert "ringtrain: rank 0: got SIGTERM" in text and "ringtrain: rank 1: got SIGTERM" in text, text
    assert f"ringtrain: requeued Slurm job {job}: it resumes from this checkpoint" in text, text
    assert re.search(rf"^job {job} on \S+, restart 1$", text, re.M), text
    _resumed_at(text, saved, path)
    assert_bitwise(final_parameters(out), uninterrupted)


def test_a_preempted_two_node_job_exits_75_and_resumes_when_submitted_again(slurm, uninterrupted, tmp_path, measured):
    """Slurm signals every process of the step: each node's ringtrain run agent and its worker together."""
    if slurm.nodes < 2:
        pytest.skip("the cluster has one node: this host's name does not resolve, or is localhost")
    out = tmp_path / "run"
    args = ("--out", str(out), "--checkpoint-dir", str(out / "ckpt"), *LONG)
    env = slurm.env(NPROC_PER_NODE="1")
    job = slurm.sbatch("two_nodes.sbatch", *args, output=tmp_path / "first-%j.out", env=env)
    k, _ = _signal_at_a_random_step(slurm, job, tmp_path / f"first-{job}.out", measured, "two ringtrain run agents")
    fields = slurm.finished(job)
    first = (tmp_path / f"first-{job}.out").read_text()
    assert (fields["JobState"], fields["ExitCode"]) == ("FAILED", "75:0"), f"{fields}\n{first[-3000:]}"
    saved, path = _saved_step(first, k)
    assert first.count(f"ringtrain run: preempted by SIGTERM at step {saved}: every rank saved") == 2, first
    again = slurm.sbatch("two_nodes.sbatch", *args, output=tmp_path / "second-%j.out", env=env)
    fields = slurm.finished(again)
    second = (tmp_path / f"second-{again}.out").read_text()
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), f"{fields}\n{second[-3000:]}"
    _resumed_at(second, saved, path)
    # Two agents of one worker each are the same 2 ranks as srun's two tasks: the same sums, bit for bit.
    assert_bitwise(final_parameters(out), uninterrupted)
