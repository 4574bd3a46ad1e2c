"""``ringtrain run --check-resume STEP`` (launcher/check_resume.py): a script that resumes exactly is said to, exit 0;
one that holds a batch across the checkpoint is named with its first differing step, exit 1; bad input refused."""

from __future__ import annotations

import subprocess

import pytest
from _launch_util import HELPERS, child_env, outputs, ringtrain_cmd

JOB = f"{HELPERS}/_prefetch_jobs.py"


def _check(tmp_path, *options: str) -> subprocess.CompletedProcess:
    command = ringtrain_cmd("run", "--nproc-per-node", "2", "--check-resume", "5", JOB, "--out", str(tmp_path),
                            "--loop", "prefetch", *options)
    return subprocess.run(command, capture_output=True, text=True, timeout=240, env=child_env())


@pytest.mark.timeout(300)
def test_a_converted_prefetch_loop_is_exact(tmp_path):
    proc = _check(tmp_path)
    assert proc.returncode == 0, outputs(proc)
    assert "--check-resume: exact: resumed from step 5" in proc.stderr, outputs(proc)
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").glob("step-*")), \
        "the script's own checkpoint_dir was used"


@pytest.mark.timeout(300)
def test_the_unconverted_loop_is_named_with_its_first_differing_step(tmp_path):
    proc = _check(tmp_path, "--plain")
    assert proc.returncode == 1, outputs(proc)
    assert "NOT exact: resumed from step 5, the first loss that differs is at step 5, micro-batch 0" in proc.stderr
    assert "ring.batches(get_batch)" in proc.stderr


@pytest.mark.parametrize("argv,needle", [
    (["--check-resume", "0"], "--check-resume 0 is not a step"),
    (["--check-resume", "5", "-H", "127.0.0.1:1,127.0.0.2:1"], "it takes no -H/--hostfile"),
])
def test_bad_check_resume_input_is_refused(argv, needle, tmp_path):
    proc = subprocess.run(ringtrain_cmd("run", *argv, JOB, "--out", str(tmp_path), "--loop", "prefetch"),
                          capture_output=True, text=True, timeout=60, env=child_env())
    assert proc.returncode == 2 and needle in proc.stderr, outputs(proc)


@pytest.mark.timeout(300)
def test_a_step_the_job_never_reaches_is_named(tmp_path):
    command = ringtrain_cmd("run", "--nproc-per-node", "2", "--check-resume", "40", JOB, "--out", str(tmp_path),
                            "--loop", "prefetch")
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, env=child_env())
    assert proc.returncode == 1 and "never reached step 40" in proc.stderr, outputs(proc)
