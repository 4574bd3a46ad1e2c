"""Shared test plumbing: multi-process jobs run through ringtrain's own launcher.

Job functions live in ``helpers/`` (``_ring_jobs.py`` ...) so spawned children can import them
(multiprocessing passes sys.path, which holds that folder, to its children).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))

from _launch_util import launch_ranks  # noqa: E402

# What the forkserver that tests' ranks are forked from imports once (launch_ranks): torch, the library and the
# job modules. A module a test job needs that is not here is imported by each rank, as with "spawn".
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "torch.distributed.checkpoint", "ringtrain.ring",
                      "ringtrain.strategies", "ringtrain.horovod", "_ring_jobs", "_fsdp_jobs", "_pipeline_jobs",
                      "_syncbn_jobs", "_fault_jobs", "_tracking_jobs", "_timeline_jobs", "_compression_jobs",
                      "_tp_jobs"]


def pytest_configure(config) -> None:
    """The CPU suite runs on the CPU whatever the machine has: its 2-rank jobs would otherwise claim
    cuda:0 and cuda:1 on a GPU machine (or be refused on a one-GPU one). GPU-marked runs
    (`make test-gpu`, `-m gpu`) see the GPUs."""
    if "gpu" not in (config.getoption("markexpr") or ""):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)  # before the server starts (at the first launch)


@pytest.fixture
def run_ranks():
    """``run_ranks(fn, *args, nprocs=2, **kwargs)`` -> each rank's return value, in rank order."""

    def run(fn, *args, nprocs: int = 2, timeout: float = 120, **kwargs):
        return launch_ranks(functools.partial(fn, **kwargs) if kwargs else fn, nprocs, args=args, timeout=timeout)

    return run
