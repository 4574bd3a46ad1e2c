"""comm/checks.py's rows (issue 20, item 5): they keep their wire format and are read by name; each
kind's words, what must agree across ranks, the mismatch message, and how rows travel (the set's
checker, or a real all_gather) (issue 38).
(comm/'s imports are checked with the whole package's in tests/test_layers.py.)"""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
from _comm_util import Member

import ringtrain.comm
from ringtrain.comm import checks, groups
from ringtrain.comm.checks import Call, Kind
from ringtrain.comm.groups import ProcessSet

COMM = os.path.dirname(ringtrain.comm.__file__)


def test_a_row_travels_as_the_same_flat_ints_as_before():
    call = checks.Call(checks.Kind.ALLGATHER, torch.float32, "cuda", op=2, root=1, shape=(3, 4), agree="x",
                       aux=3, held=2, held_digest=7)
    row = checks._encode(call)
    wire = row.wire()
    assert len(wire) == checks.WIDTH == 18
    # positions: magic, kind, dtype (+CUDA_FLAG), op, root, ndim, 8 dims, agree hash, aux, held, digest
    assert wire[:6] == [checks.MAGIC, int(checks.Kind.ALLGATHER), row.dtype, 2, 1, 2]
    assert row.dtype >= checks.CUDA_FLAG
    assert wire[6:14] == [3, 4] + [-1] * 6
    assert wire[14:] == [checks.hash_text("x"), 3, 2, 7]
    assert checks.Row.parse(wire) == row
    assert row.ours and not row.joined and not row.invalid
    assert row._replace(op=checks.INVALID_OP).invalid
    assert checks.describe(row) == "allgather(cuda float32[3, 4], op=Adasum, root_rank=1)"
    assert not checks.Row.parse([0] * checks.WIDTH).ours


def test_invalid_op_is_defined_once():
    from ringtrain.comm import validate

    assert validate.INVALID_OP is checks.INVALID_OP
    for name in os.listdir(COMM):
        if name.endswith(".py"):
            assert "-9" not in open(os.path.join(COMM, name)).read().replace("INVALID_OP = -9", ""), name


# --- descriptors, their words, the mismatch message and how rows travel (issue 38) ----------------------
def row(*args, **kwargs) -> checks.Row:
    return checks._encode(Call(*args, **kwargs))


@pytest.mark.parametrize("call, words", [
    (Call(Kind.JOIN), "join()"),
    (Call(Kind.BARRIER), "barrier()"),
    (Call(Kind.WAIT, name="x"), "synchronize() of a named op not yet submitted everywhere"),
    (Call(Kind.SETTLED), "starting named ops"),
    (Call(Kind.ALLGATHER, torch.int64, shape=(5,)), "allgather(int64[5])"),
    (Call(Kind.ALLREDUCE, torch.float32, op=1, shape=(3,)), "allreduce(float32[3], op=Sum)"),
    (Call(Kind.BROADCAST, torch.bfloat16, "cuda", root=2, shape=(2, 2)), "broadcast(cuda bfloat16[2, 2], root_rank=2)"),
    (Call(Kind.BROADCAST, torch.float32, op=checks.INVALID_OP, shape=(2,)), "broadcast(float32[2], invalid arguments)"),
    (Call(Kind.GRAD_SYNC, torch.float32, op=0, shape=(10,), aux=3), "grad_sync(float32[10], op=Average, 3 bucket(s))"),
    (Call(Kind.ALLREDUCE, shape=()), "allreduce(?[])"),
    (Call(Kind.ALLREDUCE, torch.float16, op=2, shape=(1,) * 9),
     "allreduce(float16[1, 1, 1, 1, 1, 1, 1, 1, ...], op=Adasum)"),
])
def test_describe_words_every_kind(call, words):
    assert checks.describe(checks._encode(call)) == words


def test_a_row_not_written_by_a_check_is_named_as_such():
    foreign = checks.Row.parse([7] * checks.WIDTH)
    assert checks.describe(foreign) == "something that is not a ringtrain collective (a raw torch.distributed call?)"
    assert not foreign.ours and not foreign.joined and not foreign.invalid


def test_compared_ignores_shown_dims_aux_and_named_op_fields_but_not_the_full_shape():
    a = row(Kind.ALLGATHER, torch.float32, shape=(2, 3), agree="(3,)", aux=2, held=1, held_digest=5)
    b = row(Kind.ALLGATHER, torch.float32, shape=(7, 3), agree="(3,)", aux=7)
    assert a.compared() == b.compared() and a != b
    nine = (1,) * 8
    assert row(Kind.ALLREDUCE, shape=nine + (2,), agree=str(nine + (2,))).compared() != \
        row(Kind.ALLREDUCE, shape=nine + (3,), agree=str(nine + (3,))).compared()  # past the 8 shown dims
    assert row(Kind.ALLREDUCE, torch.float32, "cuda").compared() != row(Kind.ALLREDUCE, torch.float32).compared()


def test_hash_text_is_a_stable_signed_64_bit_number():
    h = checks.hash_text("float32 [(3, 4)]")
    assert h == checks.hash_text("float32 [(3, 4)]") and -2 ** 63 <= h < 2 ** 63
    assert checks.hash_text("a") != checks.hash_text("b")
    assert checks.hash_text("") == int.from_bytes(hashlib.blake2b(b"", digest_size=8).digest(), "little", signed=True)


def test_the_mismatch_names_each_rank_and_what_it_asked_for(monkeypatch):
    rows = [row(Kind.ALLREDUCE, torch.float32, op=1, shape=(3,)),
            row(Kind.BROADCAST, torch.float32, root=0, shape=(3,))]
    error = checks.mismatch(Member([3, 5], 0), rows)
    assert error.message == ("ranks called mismatched collectives (on process set [3, 5]); each asked for:\n"
                             "    rank 3: allreduce(float32[3], op=Sum)\n"
                             "    rank 5: broadcast(float32[3], root_rank=0)\n"
                             "(the same shape everywhere is needed, except the first dimension of allgather/alltoall "
                             "inputs)")
    assert "every rank must call the same collectives in the same order" in error.hint
    assert "hvd.init(checks=False) or RINGTRAIN_HVD_CHECKS=0" in error.hint
    monkeypatch.setattr(groups, "_world_size", lambda: 2)
    assert "(on all ranks)" in checks.mismatch(ProcessSet(None), rows).message


class Recorder:
    """A checker that hands back what it is given (twice: a set of two whose ranks agree)."""

    def __init__(self):
        self.seen = []

    def exchange(self, ps, row):
        self.seen.append(row)
        return [row, row]

    def mismatch(self, ps):
        return RuntimeError("in the checker's words")


def test_exchange_goes_through_the_sets_checker_and_counts_rounds():
    checker = Recorder()
    ps = Member([0, 1], 0, checker)
    call = Call(Kind.ALLREDUCE, torch.float32, op=1, shape=(3,), aux=3)
    assert checks.exchange(ps, call) == [checks._encode(call)] * 2
    assert checker.seen == [checks._encode(call)] and ps.check_rounds == 1
    handle = checks.exchange_async(ps, call)  # a checker with no exchange_async: done at once
    assert handle.poll() and handle.wait() == [checks._encode(call)] * 2 and ps.check_rounds == 2
    assert repr(handle) == "<Handle metadata check done>"
    assert str(checks.mismatch(ps, [])) == "in the checker's words"  # the checker words its own mismatch


def test_gather_rows_travel_through_a_real_all_gather(engine):
    ps = ProcessSet(None)  # every rank of the one-rank group
    call = Call(Kind.ALLGATHER, torch.float16, shape=(4, 2), agree="(2,)", aux=4, held=2, held_digest=-3)
    assert checks.exchange(ps, call) == [checks._encode(call)]
    handle = checks.exchange_async(ps, call)
    assert handle.wait() == [checks._encode(call)] and ps.check_rounds == 2
