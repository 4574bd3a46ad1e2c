"""comm/joined.py: what a joined rank takes part in — zeros for an allreduce the active ranks agree on
(in the dtype and op the engine carries), a newly verified gradient layout followed — and nothing
where the active ranks will raise (they disagree, one's arguments are invalid, a raw call met ours)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _comm_util import EngineSpy, Member

from ringtrain.comm import checks, joined
from ringtrain.comm.checks import Call, Kind


def row(*args, **kwargs) -> checks.Row:
    return checks._encode(Call(*args, **kwargs))


JOINED = row(Kind.JOIN)


class Mirror:
    def __init__(self):
        self.switched = []

    def switch(self, layout_hash):
        self.switched.append(layout_hash)


@pytest.mark.parametrize("dtype, op, wire_dtype, engine_op", [
    (torch.float32, 0, torch.float32, dist.ReduceOp.SUM),  # Average: summed (divided by the others)
    (torch.int16, 1, torch.int32, dist.ReduceOp.SUM),
    (torch.bool, 4, torch.uint8, dist.ReduceOp.MAX),
    (torch.float64, 3, torch.float64, dist.ReduceOp.MIN),
])
def test_an_agreed_allreduce_gets_zeros_as_the_engine_carries_it(monkeypatch, dtype, op, wire_dtype, engine_op):
    spy = EngineSpy(monkeypatch, "all_reduce")
    reduce = row(Kind.ALLREDUCE, dtype, op=op, shape=(5,), aux=5)
    joined.serve([JOINED, reduce, reduce], Member([0, 1, 2], 0))
    assert spy.shapes() == [(wire_dtype, 5)]
    assert spy.calls[0]["op"] == engine_op and spy.calls[0]["group"] is None
    assert torch.count_nonzero(spy.calls[0]["values"]) == 0


def test_an_empty_allreduce_sends_nothing(monkeypatch):
    spy = EngineSpy(monkeypatch, "all_reduce")
    empty = row(Kind.ALLREDUCE, torch.float32, op=1, shape=(0,), aux=0)
    joined.serve([JOINED, empty], Member([0, 1], 0))
    assert spy.calls == []


@pytest.mark.parametrize("others", [
    [row(Kind.ALLREDUCE, torch.float32, op=1, shape=(3,), aux=3), row(Kind.ALLREDUCE, torch.float32, op=1, shape=(4,),
                                                                      agree="(4,)", aux=4)],
    [row(Kind.ALLREDUCE, torch.float32, op=1, shape=(3,), aux=3), row(Kind.ALLREDUCE, torch.float32,
                                                                      op=checks.INVALID_OP, aux=3)],
    [row(Kind.ALLREDUCE, torch.float32, op=1, shape=(3,), aux=3), checks.Row.parse([0] * checks.WIDTH)],
    [row(Kind.BROADCAST, torch.float32, root=1, shape=(3,)), row(Kind.BROADCAST, torch.float32, root=1, shape=(3,))],
])
def test_nothing_is_sent_where_the_active_ranks_will_raise(monkeypatch, others):
    spy = EngineSpy(monkeypatch, "all_reduce")
    mirror = Mirror()
    joined.serve([JOINED, *others], Member([0, 1, 2], 0), mirror=mirror)
    assert spy.calls == [] and mirror.switched == []


def test_a_newly_verified_gradient_layout_is_followed_by_the_mirror(monkeypatch):
    spy = EngineSpy(monkeypatch, "all_reduce")
    layout = row(Kind.GRAD_SYNC, torch.float32, op=0, shape=(10,), agree="AVERAGE 1.0 1.0 ...", aux=2)
    mirror = Mirror()
    joined.serve([layout, JOINED], Member([0, 1], 1), mirror=mirror)
    assert mirror.switched == [checks.hash_text("AVERAGE 1.0 1.0 ...")] and spy.calls == []
    joined.serve([layout, JOINED], Member([0, 1], 1))  # no mirror (a named op's settling): not followed
