"""``python -m ringtrain.launcher.node_signal TOKEN SIGNAL``: the signal a ``-H`` launcher sends a node over ssh.

A launcher started with ``-H``/``--hostfile`` runs each remote node's agent under an ssh client (hosts.py).
Stopping that client hangs the remote session up: the agent gets SIGHUP, which torchelastic passes on to the
workers as SIGHUP, and they end where they are — unsaved. A SIGTERM to the launcher (a scheduler's preemption,
or a user's) must reach a remote agent as SIGTERM, as it reaches a local one, so that its ranks save the step the
job agreed on and leave with exit 75 (loop/preempt.py). So the launcher gives each remote agent a token in its
environment (``RINGTRAIN_NODE_TOKEN``) and, to signal it, runs this on that host over a second ssh connection:
the process that carries the token first (the agent; its workers inherit the token) gets the signal.

Exit status: 0 when a process was signalled, 1 when none carries the token (the node already ended).
"""

from __future__ import annotations

import os
import signal
import sys

from ..liveness import procs
from ..parallel.contract import ENV

TOKEN_ENV = ENV["node_token"]  # the launcher contract's variable
MODULE = "ringtrain.launcher.node_signal"


def send(token: str, signame: str) -> list[int]:
    """Signal ``SIG<signame>`` to the first process of each tree carrying ``token`` here; their pids."""
    signum = signal.Signals[f"SIG{signame.upper().removeprefix('SIG')}"]
    sent = []
    for pid in procs.carrying(TOKEN_ENV, token):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            continue
        sent.append(pid)
    return sent


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m ringtrain.launcher.node_signal TOKEN SIGNAL", file=sys.stderr)
        return 2
    if send(*argv):
        return 0
    print(f"ringtrain: no process here carries {TOKEN_ENV}={argv[0]} (the node's agent has ended)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
