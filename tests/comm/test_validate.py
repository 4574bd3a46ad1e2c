"""comm/validate.py: running the check or not, the root every rank must name, a rank whose own
arguments are invalid (it raises its own error, the others name it), and joined ranks allowed only
where they may be."""

from __future__ import annotations

import pytest
import torch
from _comm_util import Member, as_ranks, raised, store_members

from ringtrain.comm import checks, validate
from ringtrain.comm.checks import Call, Kind
from ringtrain.comm.groups import ProcessSet
from ringtrain.errors import RingtrainError

PROBLEM = RingtrainError("broadcast got root_rank=7, which is not a rank", "pass a member's rank.")


def row(*args, **kwargs) -> checks.Row:
    return checks._encode(Call(*args, **kwargs))


@pytest.mark.parametrize("root", [True, 2, -1, "0", None])
def test_a_root_outside_the_set_is_named_with_the_sets_ranks(root):
    error = validate.root_problem(root, Member([0, 1], 0), "gather")
    assert error.message == f"gather got dst={root!r}, which is not a rank of ProcessSet(process_set_id=None, " \
                            "ranks=[0, 1])"
    assert error.hint == "dst is a rank, one of [0, 1], the same on every rank."


def test_a_members_rank_is_a_root_and_the_argument_is_named_as_asked():
    assert validate.root_problem(1, Member([0, 1], 0), "gather") is None
    assert "reduce got root=3" in str(validate.root_problem(3, ProcessSet(None), "reduce", name="root"))


def test_unchecked_or_alone_nothing_is_exchanged_but_an_own_problem_still_raises():
    pair = Member([0, 1], 0, checker=None)  # an exchange would need a group: there is none
    assert validate.run(pair, Call(Kind.BARRIER), False) is None
    assert validate.run(ProcessSet(None), Call(Kind.BARRIER), True) is None
    for ps, enabled in ((pair, False), (ProcessSet(None), True)):
        with pytest.raises(RingtrainError) as error:
            validate.run(ps, Call(Kind.BROADCAST), enabled, PROBLEM)
        assert error.value is PROBLEM
    assert pair.check_rounds == 0


def test_agreeing_ranks_get_the_rows():
    members = store_members([0, 1])
    def call(r):
        return validate.run(members[r], Call(Kind.ALLREDUCE, torch.float32, op=1, shape=(3,), aux=3), True)

    for rows in as_ranks(call):
        assert [r.kind for r in rows] == [Kind.ALLREDUCE] * 2 and [r.aux for r in rows] == [3, 3]


def test_disagreeing_ranks_both_raise_the_mismatch():
    members = store_members([0, 1])
    shapes = [(3,), (4,)]
    out = as_ranks(lambda r: validate.run(members[r], Call(Kind.ALLREDUCE, torch.float32, op=1, shape=shapes[r],
                                                           agree=str(shapes[r])), True))
    for result in out:
        text = raised(result)
        assert "collective #1 differs across ranks: rank 0 called allreduce(float32[3], op=Sum); rank 1 called " \
               "allreduce(float32[4], op=Sum)" in text
        assert "HINT: every rank must call the same collective" in text


def test_a_rank_with_invalid_arguments_raises_its_own_error_and_the_others_name_it():
    members = store_members([0, 1])
    out = as_ranks(lambda r: validate.run(members[r], Call(Kind.BROADCAST, torch.float32, root=0, shape=(2,)), True,
                                          PROBLEM if r == 1 else None))
    assert out[1].error is PROBLEM
    assert str(out[0].error) == ("rank(s) [1] called broadcast with invalid arguments, so no rank ran it\n"
                                 "HINT: see the error raised on rank(s) [1].")


def test_joined_ranks_are_allowed_only_where_they_may_be():
    ps = Member([0, 1, 2], 0)
    reduce = row(Kind.ALLREDUCE, torch.float32, op=1, shape=(3,))
    rows = [reduce, row(Kind.JOIN), reduce]
    validate.compare(ps, rows, allow_joined=True)
    with pytest.raises(RingtrainError) as error:
        validate.compare(ps, rows, allow_joined=False)
    assert error.value.message == ("allreduce(float32[3], op=Sum) was called while rank(s) [1] had already called "
                                   "join(); joined ranks only take part in allreduce and barrier")
    assert error.value.hint == "call join() only after the last collective other than allreduce (as in Horovod)."


def test_a_row_not_written_by_a_check_or_a_differing_one_is_a_mismatch():
    ps = Member([0, 1], 0)
    reduce = row(Kind.ALLREDUCE, torch.float32, op=1, shape=(3,))
    for other in (checks.Row.parse([0] * checks.WIDTH), row(Kind.ALLREDUCE, torch.float32, op=3, shape=(3,))):
        with pytest.raises(RingtrainError, match="ranks called mismatched collectives") as error:
            validate.compare(ps, [reduce, other], allow_joined=True)
        assert "rank 1: " in str(error.value) and "HINT:" in str(error.value)
