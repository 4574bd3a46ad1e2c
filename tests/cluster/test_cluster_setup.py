"""scripts/one_node_slurm.sh's `check`: why a Slurm cluster cannot be started here, which the tests' skips and
`make test-cluster` print (issue 32: a skip says why). Quick, and run everywhere: it starts nothing."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from _cluster import BASH, CLUSTER_SCRIPT


def _check(*prefix: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, BASH, str(CLUSTER_SCRIPT), "check"], capture_output=True, text=True, timeout=30,
                          env=env)


@pytest.mark.skipif(os.geteuid() != 0, reason="as another user `check` answers 'not root' before it looks at PATH")
def test_check_names_the_programs_missing_from_path_and_the_make_target():
    proc = _check(env={"PATH": ""})
    assert proc.returncode == 1, proc
    assert proc.stdout.startswith("Slurm/munge not installed (not on PATH: munged slurmctld slurmd srun sbatch "), proc
    assert "`make test-cluster` installs slurm-wlm and munge" in proc.stdout, proc


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv (util-linux)")
def test_check_refuses_another_user_saying_slurmd_needs_root():
    proc = _check("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    assert proc.returncode == 1, proc
    assert proc.stdout.startswith("not root: slurmd must run as root"), proc
