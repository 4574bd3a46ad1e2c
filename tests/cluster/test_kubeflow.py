"""Kubeflow's PyTorchJob without Kubernetes (issue 32, item 4): examples/cluster/pytorchjob.yaml's command, run as its
two pods would run it, both on this machine, with the variables the training operator sets in each pod
(kubeflow/training-operator, pkg/controller.v1/pytorch/envvar.go: MASTER_ADDR, MASTER_PORT, WORLD_SIZE = replicas x
nprocPerNode, RANK = the pod's index, PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE; Kubernetes expands the
command's $(VAR)). `ringtrain run` must take its place from the PET_* variables, and the job train as one process."""

from __future__ import annotations

import json
import re

from _cluster import EPOCHS, EXAMPLES, assert_close_to, final_parameters, job_env, outputs, run_together
from _launch_util import free_port

MANIFEST = EXAMPLES / "pytorchjob.yaml"


def _manifest() -> tuple[str, list[list[str]]]:
    """nprocPerNode, and each replica type's command (a flow sequence of double-quoted strings: JSON)."""
    text = MANIFEST.read_text()
    nproc = re.search(r'^\s*nprocPerNode: "(\d+)"$', text, re.M).group(1)
    commands = [json.loads(line) for line in re.findall(r"^\s*command: (\[.*\])$", text, re.M)]
    return nproc, commands


def test_the_manifest_runs_the_same_command_in_the_master_and_worker_pods():
    nproc, commands = _manifest()
    assert nproc == "1" and len(commands) == 2 and commands[0] == commands[1], commands
    assert commands[0][:2] == ["ringtrain", "run"] and "--nnodes" not in commands[0], commands[0]  # PET_NNODES


def test_the_pytorchjob_command_in_two_pods_trains_as_one_process(bin_dir, one_process, tmp_path, measured):
    nproc, (command, _) = _manifest()
    shared, port = tmp_path / "shared", str(free_port())
    argvs, envs = [], []
    for index in range(2):  # the Master pod, then Worker 0
        envs.append(job_env(bin_dir, PYTHONUNBUFFERED="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2",
                            RANK=str(index), PET_NNODES="2", PET_NODE_RANK=str(index), PET_NPROC_PER_NODE=nproc))
        argvs.append([arg.replace("$(MASTER_ADDR)", "127.0.0.1").replace("$(MASTER_PORT)", port)
                      .replace("/shared", str(shared)) for arg in command])
    results = run_together(argvs, envs, timeout=240)
    for result in results:
        assert result.returncode == 0, outputs(result)
    text = results[0].stdout + results[1].stdout
    ranks = sorted(re.findall(r"rank (\d+) of 2, node (\d+), started by torchelastic", text))
    assert ranks == [("0", "0"), ("1", "1")], text  # one worker in each pod
    worst = assert_close_to(final_parameters(shared / "runs" / "cluster"), one_process)
    assert EPOCHS == 2  # the manifest's command leaves --epochs at train.py's default, 2
    measured(f"PyTorchJob command, two pods (PET_NNODES=2, PET_NODE_RANK): parameters within {worst:.1e} of one "
             "process")
