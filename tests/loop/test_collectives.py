"""Checked collectives (debug_collectives): a rank that calls something else, or nothing, is named."""

from __future__ import annotations

import pytest

import _ring_jobs as jobs

pytestmark = pytest.mark.timeout(120)


def test_skipped_collective_is_named_on_every_rank(run_ranks):
    for message, seconds in run_ranks(jobs.misbehave, "skip"):
        assert "collective #2 differs across ranks" in message
        assert "rank 0 called all_reduce(op=sum, float32[3])" in message
        assert "rank 1 called barrier()" in message and "HINT:" in message
        assert seconds < 10


def test_mismatched_shapes_are_named(run_ranks):
    for message, _ in run_ranks(jobs.misbehave, "shape"):
        assert "rank 0 called all_reduce(op=sum, float32[3])" in message
        assert "rank 1 called all_reduce(op=sum, float32[4])" in message


def test_rank_that_never_arrives_is_named_within_the_timeout(run_ranks):
    waiting, absent = run_ranks(jobs.misbehave, "absent")
    message, seconds = waiting
    assert "rank(s) [1] never arrived within 4s" in message and "rank 0 called barrier()" in message
    assert seconds < 8
    assert absent[0] == "slept"
