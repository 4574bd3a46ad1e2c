"""Fixtures for comm/'s own tests: a one-rank engine in this process, and the one real 2-rank job."""

from __future__ import annotations

import _comm_jobs
import pytest
from _comm_util import one_rank_group
from _launch_util import launch_ranks


@pytest.fixture
def engine():
    """A real one-rank Gloo group (HashStore) for this test: torch.distributed calls run, on one rank."""
    with one_rank_group():
        yield


@pytest.fixture(scope="session")
def two_ranks():
    """What ``_comm_jobs.two_ranks`` returned on each of 2 real Gloo ranks (one launch for all of tests/comm)."""
    return launch_ranks(_comm_jobs.two_ranks, 2, timeout=60)
