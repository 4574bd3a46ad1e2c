"""The worker's exit (launcher/worker.py ``finish``): Python's own first exit step, threads included."""

from __future__ import annotations

import pytest

import _ac_jobs as jobs
from _launch_util import launch_ranks


@pytest.mark.timeout(120)
def test_a_job_that_leaves_a_thread_pool_exits():
    """torch.compile leaves a ThreadPoolExecutor whose idle workers wait for work until concurrent.futures' exit
    callback tells them to stop; joining the threads without that callback hung every compiled job's ranks."""
    assert launch_ranks(jobs.leaves_a_thread_pool, 2, timeout=90) == [7, 7]
