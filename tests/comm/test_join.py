"""comm/join.py: barrier and join on one rank, the refusals (not a member, checks off), which rank
joined last (ties: the highest), a strict barrier that meets another call, and a plain one that waits
while the other rank's mismatched call raises there. Ranks are threads; rounds go through a HashStore."""

from __future__ import annotations

import pytest
import torch
from _comm_util import Member, as_ranks, raised, store_members

from ringtrain.comm import validate
from ringtrain.comm.join import barrier, join
from ringtrain.comm.checks import Call, Kind
from ringtrain.comm.groups import ProcessSet
from ringtrain.errors import RingtrainError


def test_alone_join_returns_this_rank_and_barrier_returns():
    assert join(process_set=ProcessSet(None)) == 0
    assert barrier(process_set=ProcessSet(None)) is None
    assert join(process_set=ProcessSet([0]), check=False) == 0


def test_a_rank_outside_the_set_is_refused():
    for call in (join, barrier):
        with pytest.raises(RingtrainError) as error:
            call(process_set=ProcessSet([1]))
        assert "on ProcessSet(process_set_id=None, ranks=[1]) was called on rank 0, which is not in that process " \
               "set" in str(error.value)


def test_join_needs_the_checks():
    with pytest.raises(RingtrainError) as error:
        join(process_set=Member([0, 1], 0), check=False)
    assert str(error.value) == ("join() was called with the collective checks turned off; joined ranks learn what to "
                                "take part in from the checks\nHINT: leave checks on (the default) in jobs that use "
                                "join().")


@pytest.mark.parametrize("rounds, steps, last", [((5, 3), (0, 0), 4), ((3, 3), (0, 0), 7), ((5, 3), (0, 4), 7)])
def test_every_rank_learns_who_joined_last(rounds, steps, last):
    members = store_members([4, 7])
    for m, n, s in zip(members, rounds, steps):
        m.check_rounds, m.grad_steps = n, s  # what each had taken part in when it joined

    assert as_ranks(lambda r: join(process_set=members[r])) == [last, last]


def test_a_barrier_returns_once_both_are_in_it():
    members = store_members([0, 1])
    assert as_ranks(lambda r: barrier(process_set=members[r])) == [None, None]
    assert as_ranks(lambda r: barrier(process_set=members[r], strict=True)) == [None, None]


def allreduce_call() -> Call:
    return Call(Kind.ALLREDUCE, torch.float32, op=1, shape=(3,), agree="(3,)", aux=3)


def test_a_strict_barrier_meeting_another_call_raises_on_every_rank():
    members = store_members([0, 1])

    def rank(r):
        if r == 0:
            return barrier(process_set=members[0], strict=True)
        return validate.run(members[1], allreduce_call(), True)

    for result in as_ranks(rank):
        assert "collective #1 differs across ranks: rank 0 called barrier(); rank 1 called allreduce(float32[3], " \
               "op=Sum)" in raised(result)


def test_a_plain_barrier_keeps_waiting_while_the_other_ranks_call_raises_there():
    members = store_members([0, 1])

    def rank(r):
        if r == 0:
            return barrier(process_set=members[0])
        try:
            validate.run(members[1], allreduce_call(), True)
        except RingtrainError as e:
            error = str(e)
        barrier(process_set=members[1])  # after its error, rank 1 comes to the barrier too
        return error

    out = as_ranks(rank)
    assert out[0] is None
    assert "rank 0 called barrier(); rank 1 called allreduce(float32[3], op=Sum)" in out[1]
