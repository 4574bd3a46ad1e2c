"""comm/store_check.py: descriptors through a store (a HashStore here, each rank a thread): rows come
back in set-rank order, a rank that never arrives is named with what the others called and the HINT,
a mismatch is worded in the callers' own words, and old rounds' keys are deleted."""

from __future__ import annotations

import json
import time

import pytest
import torch
import torch.distributed as dist
from _comm_util import Member, as_ranks, post_row, store_members

from ringtrain.comm import checks, store_check
from ringtrain.comm.checks import Call, Kind
from ringtrain.comm.store_check import StoreRows
from ringtrain.errors import RingtrainError


def allreduce(numel: int, aux: int = 0) -> Call:
    return Call(Kind.ALLREDUCE, torch.float32, op=1, shape=(numel,), aux=aux)


def test_every_member_gets_every_row_in_set_rank_order():
    store = dist.HashStore()
    members = store_members([4, 9], store=store)
    rows = as_ranks(lambda r: checks.exchange(members[r], allreduce(3, aux=10 + r)))
    want = [checks._encode(allreduce(3, aux=10)), checks._encode(allreduce(3, aux=11))]
    assert rows == [want, want]
    assert [m.checker.round for m in members] == [1, 1] and [m.check_rounds for m in members] == [1, 1]
    posted = json.loads(store.get("check/1/1"))
    assert posted == {"row": want[1].wire(), "call": "allreduce(float32[3], op=Sum)"}


def test_a_rank_that_never_arrives_is_named_with_what_the_others_called():
    store = dist.HashStore()
    ps = Member([2, 5], 0, StoreRows(store, 0.2))
    with pytest.raises(RingtrainError) as error, ps.checker.describing("all_reduce(op=sum, float32[3])"):
        checks.exchange(ps, allreduce(3))
    assert error.value.message == ("collective #1: rank(s) [5] never arrived within 0.2s; "
                                   "rank 2 called all_reduce(op=sum, float32[3])")
    assert error.value.hint == store_check.HINT_MISSING
    assert "skipped this collective (a branch on the rank, an early return or break) or are stuck or dead" in \
           str(error.value)
    assert ps.checker._text is None  # the caller's words are dropped after the block, error or not


def test_of_three_ranks_the_missing_two_are_named_and_the_arrived_one_quoted():
    store = dist.HashStore()
    post_row(store, 1, 1, Call(Kind.BARRIER))  # rank 1 arrived (in a barrier); rank 2 did not
    ps = Member([0, 1, 2], 0, StoreRows(store, 0.2))
    with pytest.raises(RingtrainError) as error:
        checks.exchange(ps, Call(Kind.BROADCAST, torch.int64, root=0, shape=(2,)))
    assert error.value.message == ("collective #1: rank(s) [2] never arrived within 0.2s; rank 0 called "
                                   "broadcast(int64[2], root_rank=0); rank 1 called barrier()")


def test_a_mismatch_is_worded_in_each_callers_words():
    members = store_members([0, 1])

    def call(r):
        checker = members[r].checker
        with checker.describing(["all_reduce(op=sum, float32[3])", "all_gather(float32[2, 2])"][r]):
            rows = checks.exchange(members[r], allreduce(3) if r == 0 else Call(Kind.ALLGATHER, torch.float32,
                                                                                 shape=(2, 2)))
        return rows, checks.mismatch(members[r], rows)

    for rows, error in as_ranks(call):
        assert rows[0].compared() != rows[1].compared()
        assert error.message == ("collective #1 differs across ranks: rank 0 called all_reduce(op=sum, float32[3]); "
                                 "rank 1 called all_gather(float32[2, 2])")
        assert error.hint == store_check.HINT_DIFFERENT
        assert "(all_gather: same trailing dimensions)" in error.hint


def test_each_rank_deletes_its_key_two_rounds_back_and_the_prefix_is_its_own():
    store = dist.HashStore()
    members = store_members([0, 1], prefix="hvd-check", store=store)
    as_ranks(lambda r: [checks.exchange(members[r], Call(Kind.BARRIER)) for _ in range(3)])
    keys = {f"hvd-check/{n}/{r}": store.check([f"hvd-check/{n}/{r}"]) for n in (1, 2, 3) for r in (0, 1)}
    assert keys == {"hvd-check/1/0": False, "hvd-check/1/1": False, "hvd-check/2/0": True, "hvd-check/2/1": True,
                    "hvd-check/3/0": True, "hvd-check/3/1": True}
    assert not store.check(["check/1/0"])


def test_a_peer_that_arrives_later_within_the_timeout_is_waited_for():
    store = dist.HashStore()
    ps = Member([0, 1], 0, StoreRows(store, 10.0))

    def late_peer(r):
        if r == 1:
            while not store.check(["check/1/0"]):  # rank 0 posts first, then rank 1
                time.sleep(0.001)
            post_row(store, 1, 1, allreduce(3, aux=1))
            return None
        return checks.exchange(ps, allreduce(3))

    rows = as_ranks(late_peer)[0]
    assert [r.aux for r in rows] == [0, 1]
