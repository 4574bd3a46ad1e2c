"""comm/move.py: Horovod's alltoall split rules (each a ValueError with its HINT), one rank's
allgather / alltoall / broadcast / gather results, bytes moved as bytes, and a root outside the set."""

from __future__ import annotations

import pytest
import torch
from _comm_util import EngineSpy, Member

from ringtrain.comm import move
from ringtrain.comm.groups import ProcessSet
from ringtrain.comm.validate import InvalidArgument
from ringtrain.errors import RingtrainError

ALONE = ProcessSet(None)
ROWS = torch.arange(10.0).reshape(5, 2)


@pytest.mark.parametrize("splits, n, want", [
    (None, 1, [5]), ([2, 3], 2, [2, 3]), ([1, 1], 2, [1, 1]), (torch.tensor([0, 5], dtype=torch.int32), 2, [0, 5]),
    ((4, 0, 1), 3, [4, 0, 1]),
])
def test_splits_that_follow_horovods_rules(splits, n, want):
    assert move._splits(ROWS, splits, n) == (want, None)


@pytest.mark.parametrize("tensor, splits, n, says, hint", [
    (ROWS, None, 2, "alltoall without splits divides the first dimension equally, but 5 rows do not divide among 2 "
     "ranks", "pass splits=[rows for rank 0, rows for rank 1, ...]"),
    (ROWS, torch.tensor([2, 3]), 2, "alltoall got splits of dtype int64; they must be 32-bit integers (as in Horovod)",
     "torch.tensor(splits, dtype=torch.int32)"),
    (ROWS, torch.tensor([[2, 3]], dtype=torch.int32), 2, "alltoall got a 2-d splits tensor", "pass a 1-d tensor"),
    (ROWS, [2, 3], 3, "alltoall got 2 splits for 3 ranks", "give one row count per rank of the process set (3)."),
    (ROWS, [3, 3], 2, "alltoall got splits=[3, 3] for a tensor with 5 rows; the splits add up to more rows than "
     "there are, or one is negative", "give 2 non-negative counts adding up to at most the first dimension (5)."),
    (ROWS, [-1, 2], 2, "alltoall got splits=[-1, 2]", "non-negative"),
    (torch.tensor(1.0), None, 2, "alltoall got a 0-d tensor", "pass a tensor with at least one dimension."),
])
def test_splits_that_break_them_are_value_errors(tensor, splits, n, says, hint):
    send, problem = move._splits(tensor, splits, n)
    assert send == [0] * n and isinstance(problem, InvalidArgument) and isinstance(problem, ValueError)
    assert says in problem.message and hint in problem.hint


def test_a_0_d_splits_tensor_is_an_invalid_argument_too():
    """It raised a bare TypeError ('int' object is not iterable) before the check, on one rank only."""
    _, problem = move._splits(ROWS, torch.tensor(5, dtype=torch.int32), 2)
    assert isinstance(problem, InvalidArgument) and "HINT" in str(problem)


def test_alone_alltoall_sends_the_split_rows_and_says_what_it_received():
    got, received = move.alltoall(ROWS, [3], process_set=ALONE).wait()
    assert torch.equal(got, ROWS[:3]) and received.tolist() == [3] and received.dtype == torch.int32
    got, received = move.alltoall(ROWS, process_set=ALONE).wait()
    assert torch.equal(got, ROWS) and received.tolist() == [5]
    with pytest.raises(InvalidArgument, match="alltoall got 2 splits for 1 ranks"):
        move.alltoall(ROWS, [2, 3], process_set=ALONE)


def test_alone_allgather_and_gather_are_copies_a_scalar_becomes_one_row():
    x = torch.tensor(3, dtype=torch.int16)
    got = move.allgather(x, process_set=ALONE).wait()
    assert got.shape == (1,) and got.dtype == torch.int16 and got.tolist() == [3]
    got = move.allgather(ROWS, process_set=ALONE).wait()
    assert torch.equal(got, ROWS) and got.data_ptr() != ROWS.data_ptr()
    assert torch.equal(move.gather_to(ROWS, 0, process_set=ALONE).wait(), ROWS)
    both = move.grouped_allgather([ROWS, x], process_set=ALONE).wait()
    assert torch.equal(both[0], ROWS) and both[1].tolist() == [3]


def test_alone_broadcast_is_a_copy_or_the_tensor_itself_in_place():
    out = move.broadcast(ROWS, 0, process_set=ALONE).wait()
    assert torch.equal(out, ROWS) and out is not ROWS
    assert move.broadcast(ROWS, 0, process_set=ALONE, inplace=True).wait() is ROWS


@pytest.mark.parametrize("root", [1, -1, "0", 0.0])
def test_a_broadcast_root_outside_the_set_is_named(root):
    with pytest.raises(RingtrainError) as error:
        move.broadcast(ROWS, root, process_set=ALONE)
    assert error.value.message == (f"broadcast got root_rank={root!r}, which is not a rank of "
                                   "ProcessSet(process_set_id=0, ranks=all) (ranks [0])")
    assert error.value.hint == "pass the global rank of a member of the process set as root_rank."


def test_a_gather_root_outside_the_set_is_named():
    with pytest.raises(RingtrainError, match=r"gather got dst=2, which is not a rank of"):
        move.gather_to(ROWS, 2, process_set=ALONE)


def test_a_broadcast_moves_bytes_and_writes_back_into_a_non_contiguous_target(monkeypatch, engine):
    spy = EngineSpy(monkeypatch, "broadcast")
    target = torch.arange(6, dtype=torch.int16).reshape(2, 3).t()  # int16: Gloo has no int16, bytes it takes
    out = move.broadcast(target, 0, process_set=Member([0, 1], 0), inplace=True, check=False).wait()
    assert out is target and target.tolist() == [[0, 3], [1, 4], [2, 5]]
    assert spy.shapes() == [(torch.uint8, 12)] and spy.calls[0]["src"] == 0


def test_empty_bytes_come_back_as_an_empty_tensor_of_the_asked_shape():
    out = move._from_bytes(torch.empty((0, 8), dtype=torch.uint8), torch.float64, (0, 1))
    assert out.shape == (0, 1) and out.dtype == torch.float64
