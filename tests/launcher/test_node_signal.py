"""node_signal: the launcher's SIGTERM to a node over ssh finds that node's agent by the token in its environment —
the first process of the tree carrying it, not the workers that inherited it (real processes, real signals)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from ringtrain.launcher import node_signal
from ringtrain.liveness import procs

pytestmark = pytest.mark.timeout(60)

# An "agent" with one "worker": both carry the token; the agent prints the worker's pid once it runs.
AGENT = ("import subprocess, sys, time; w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
         "print(w.pid, flush=True); time.sleep(60)")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc (Linux)")
def test_the_agent_not_its_workers_gets_the_signal():
    token = os.urandom(8).hex()
    agent = subprocess.Popen([sys.executable, "-c", AGENT], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, node_signal.TOKEN_ENV: token})
    worker = int(agent.stdout.readline())
    try:
        assert procs.carrying(node_signal.TOKEN_ENV, token) == [agent.pid]
        assert node_signal.main([token, "TERM"]) == 0
        assert agent.wait(timeout=30) == -signal.SIGTERM
        assert procs.exists(worker) and not procs.ended(worker)  # the agent passes the signal on, not this
    finally:
        for pid in (agent.pid, worker):
            if not procs.ended(pid):
                os.kill(pid, signal.SIGKILL)
        agent.wait()


def test_a_token_no_process_carries_is_exit_1_and_says_so(capsys):
    assert node_signal.main([os.urandom(8).hex(), "TERM"]) == 1
    assert "the node's agent has ended" in capsys.readouterr().err
    assert node_signal.main(["only-one-argument"]) == 2


def test_a_node_the_signal_cannot_reach_is_named_and_left_to_the_hang_up():
    from ringtrain.launcher.hosts import Node, _terminate_over_ssh

    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the node's ssh client, running
    fails = [sys.executable, "-c", "import sys; print('ssh: connect to host far: No route to host'); sys.exit(255)"]
    try:
        said: list = []
        assert _terminate_over_ssh([agent], [Node("far", 0, 1, False, ["ssh"], fails)], said.append) == set()
        assert said == ["node 0 (far): SIGTERM over ssh did not reach its agent (exit 255: ssh: connect to host far: "
                        "No route to host); its session is hung up instead"]
        reaches = [sys.executable, "-c", "pass"]
        assert _terminate_over_ssh([agent], [Node("far", 0, 1, False, ["ssh"], reaches)], said.append) == {0}
        assert _terminate_over_ssh([agent], [Node("here", 0, 1, True, ["python"])], said.append) == set()  # local
        assert len(said) == 1
    finally:
        agent.kill()
        agent.wait()
