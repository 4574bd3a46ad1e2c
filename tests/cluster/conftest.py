"""Real schedulers on this machine (issue 32, items 3 and 4): a Slurm cluster of this host started for the session
(scripts/one_node_slurm.sh), Open MPI's mpirun, and the command of Kubeflow's PyTorchJob. The jobs are
examples/cluster/'s scripts, submitted as a user would submit them; each must train what one process trains.

Where Slurm and munge are not installed, this is not root, or a cluster does not start, the Slurm tests skip and say
why (Open MPI's likewise without mpirun; the PyTorchJob's needs neither). `make test` runs the tests without the
`cluster` marker (about 70 s here with everything installed, 16 s without); `make test-cluster` installs the programs
and runs the whole folder, and a skip fails it. What the tests measured (the preemption's signal-to-exit time, ...) is
printed at the end of the run. The cluster is the session's: the last test's teardown stops its daemons and jobs.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from _cluster import BASH, CLUSTER_SCRIPT, EPOCHS, REPO, TRAIN, Slurm, final_parameters, job_env, outputs, slurm_missing
from _launch_util import child_env

_MEASURED = pytest.StashKey[list]()


def pytest_configure(config) -> None:
    config.stash[_MEASURED] = []


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    lines = config.stash.get(_MEASURED, [])
    if lines:
        terminalreporter.section("what the cluster tests measured")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture
def measured(request):
    """``measured("...")``: a line for the run's summary (docs/benchmarks.md records them)."""
    return request.config.stash[_MEASURED].append


@pytest.fixture(scope="session")
def bin_dir(tmp_path_factory) -> Path:
    """``python`` and ``ringtrain`` as the example scripts call them: this test run's interpreter and ringtrain (this
    checkout's, on their own PYTHONPATH: mpirun passes on only the variables it is given with -x)."""
    folder = tmp_path_factory.mktemp("bin")
    pythonpath = shlex.quote(child_env()["PYTHONPATH"])
    for name, tail in (("python", '"$@"'), ("ringtrain", '-m ringtrain "$@"')):
        (folder / name).write_text(f"#!/bin/sh\nPYTHONPATH={pythonpath} exec {shlex.quote(sys.executable)} {tail}\n")
        (folder / name).chmod(0o755)
    return folder


@pytest.fixture(scope="session")
def one_process(tmp_path_factory, bin_dir) -> dict[str, torch.Tensor]:
    """train.py in one process, no launcher: what every job of EPOCHS must reach (to TOLERANCE)."""
    out = tmp_path_factory.mktemp("one-process")
    proc = subprocess.run([sys.executable, str(TRAIN), "--out", str(out), "--epochs", str(EPOCHS)], cwd=REPO,
                          env=job_env(bin_dir), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and "started by single" in proc.stdout, outputs(proc)
    return final_parameters(out)


@pytest.fixture(scope="session")
def slurm(bin_dir):
    """A Slurm cluster of this host for the session, stopped at its end with every daemon and job step."""
    why = slurm_missing()
    if why:
        pytest.skip(why)
    # Not under pytest's tmp folders: munged wants a socket folder others can search, and those are 0700.
    folder = Path(tempfile.mkdtemp(prefix="ringtrain-slurm-"))
    started = subprocess.run([BASH, str(CLUSTER_SCRIPT), "start", str(folder)], capture_output=True, text=True,
                             timeout=120)
    try:
        if started.returncode != 0:
            pytest.skip(f"a Slurm cluster could not be started here: {started.stderr.strip()[-1500:]}")
        yield Slurm(folder, bin_dir)
    finally:
        stopped = subprocess.run([BASH, str(CLUSTER_SCRIPT), "stop", str(folder)], capture_output=True, text=True,
                                 timeout=120)
        shutil.rmtree(folder, ignore_errors=True)
        assert stopped.returncode == 0, stopped.stderr
