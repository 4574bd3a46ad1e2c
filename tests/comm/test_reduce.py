"""comm/reduce.py: Horovod's reductions on this one rank (prescale before, postscale after, in place or
not, dtypes kept), tensor fusion (one engine call per dtype and device, whatever the count), Average
dividing by the set's size, the reducescatter split, and the refusals, each with its HINT. The engine
calls run on a real one-rank Gloo group where a set of two is played from rank 0."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _comm_util import EngineSpy, Member

from ringtrain.comm import reduce
from ringtrain.comm.ops import ReduceOp
from ringtrain.comm.groups import ProcessSet
from ringtrain.errors import RingtrainError

ALONE = ProcessSet(None)  # this process, rank 0 of 1 (no group)


@pytest.mark.parametrize("rows, n, split", [(7, 3, [3, 2, 2]), (2, 4, [1, 1, 0, 0]), (6, 2, [3, 3]), (0, 2, [0, 0])])
def test_reducescatter_gives_the_first_ranks_one_row_more(rows, n, split):
    assert reduce.split_rows(rows, n) == split


def test_alone_an_allreduce_is_a_scaled_copy_in_the_inputs_dtype():
    x = torch.tensor([[1.0, -2.0]])
    out = reduce.allreduce(x, ReduceOp.SUM, prescale=2.0, postscale=0.25, process_set=ALONE).wait()
    assert out.tolist() == [[0.5, -1.0]] and out.data_ptr() != x.data_ptr() and x.tolist() == [[1.0, -2.0]]
    ints = reduce.allreduce(torch.tensor([3, -3], dtype=torch.int16), ReduceOp.SUM, prescale=2.5,
                            process_set=ALONE).wait()
    assert ints.dtype == torch.int16 and ints.tolist() == [7, -7]  # scaled in float64, truncated toward zero
    assert reduce.allreduce(x, process_set=ALONE).wait().tolist() == [[1.0, -2.0]]  # Average of one


def test_in_place_writes_into_the_input_even_non_contiguous():
    x = torch.arange(6.0).reshape(2, 3).t()
    handle = reduce.allreduce(x, ReduceOp.SUM, prescale=3.0, process_set=ALONE, inplace=True)
    assert handle.wait() is x and x.tolist() == [[0.0, 9.0], [3.0, 12.0], [6.0, 15.0]]


def test_grouped_allreduce_keeps_each_tensors_shape_and_dtype():
    tensors = [torch.ones(2, 2), torch.tensor([1, 2]), torch.tensor([True, False])]
    out = reduce.grouped_allreduce(tensors, ReduceOp.MAX, process_set=ALONE).wait()
    assert [(o.shape, o.dtype) for o in out] == [(t.shape, t.dtype) for t in tensors]
    assert [o.tolist() for o in out] == [t.tolist() for t in tensors]


def test_fusion_is_one_engine_call_per_dtype(monkeypatch, engine):
    spy = EngineSpy(monkeypatch, "all_reduce")
    tensors = [torch.ones(2, 2), torch.tensor([3, -3, 5]), torch.full((3,), 2.0),
               torch.tensor([7, 9], dtype=torch.int16)]
    out = reduce.grouped_allreduce(tensors, ReduceOp.SUM, process_set=Member([0, 1], 0), check=False).wait()
    # float32: 4 + 3 numbers in one buffer; int64; int16 travels as int32
    assert spy.shapes() == [(torch.float32, 7), (torch.int64, 3), (torch.int32, 2)]
    assert all(c["op"] == dist.ReduceOp.SUM for c in spy.calls)
    assert [o.tolist() for o in out] == [t.tolist() for t in tensors]  # one real rank: its own values
    assert [o.dtype for o in out] == [t.dtype for t in tensors]


def test_an_average_divides_by_the_sets_size_integers_as_c_does(monkeypatch, engine):
    spy = EngineSpy(monkeypatch, "all_reduce")
    # a set of 2 played by this one rank: the sum is its own values (as if the other sent zeros)
    out = reduce.grouped_allreduce([torch.tensor([3.0, 5.0]), torch.tensor([3, -3, 5])], process_set=Member([0, 1], 0),
                                   check=False).wait()
    assert out[0].tolist() == [1.5, 2.5] and out[1].tolist() == [1, -1, 2]
    assert [c["op"] for c in spy.calls] == [dist.ReduceOp.SUM] * 2  # Gloo has no AVG: summed, then divided


def test_an_empty_tensor_reaches_no_engine(monkeypatch, engine):
    spy = EngineSpy(monkeypatch, "all_reduce")
    out = reduce.allreduce(torch.empty(0), process_set=Member([0, 1], 0), check=False).wait()
    assert out.shape == (0,) and spy.calls == []


def test_alone_reducescatter_and_reduce_return_the_whole_tensor():
    x = torch.arange(6, dtype=torch.int16).reshape(3, 2)
    out = reduce.reducescatter(x, ReduceOp.SUM, prescale=2.0, process_set=ALONE).wait()
    assert out.dtype == torch.int16 and out.tolist() == [[0, 2], [4, 6], [8, 10]]
    got = reduce.reduce_to(x, 0, ReduceOp.SUM, process_set=ALONE).wait()
    assert got.dtype == torch.int16 and torch.equal(got, x)
    grouped = reduce.grouped_reducescatter([x, x.float()], ReduceOp.SUM, process_set=ALONE).wait()
    assert torch.equal(grouped[0], x) and torch.equal(grouped[1], x.float())


def test_alone_adasum_is_the_scaled_tensor_in_its_dtype():
    x = torch.tensor([1.0, -2.0], dtype=torch.float16)
    out = reduce.allreduce(x, ReduceOp.ADASUM, prescale=2.0, postscale=3.0, process_set=ALONE).wait()
    assert out.dtype == torch.float16 and out.tolist() == [6.0, -12.0]


@pytest.mark.parametrize("run, says, hint", [
    (lambda: reduce.reducescatter(torch.tensor(1.0), process_set=ALONE),
     "reducescatter got a 0-d tensor; it splits the first dimension", "pass a tensor with at least one dimension."),
    (lambda: reduce.reducescatter(torch.ones(2), ReduceOp.ADASUM, process_set=ALONE),
     "reducescatter does not support op=Adasum", "use op=Sum or Average."),
    (lambda: reduce.reduce_to(torch.ones(2), 3, process_set=ALONE),
     "reduce got dst=3, which is not a rank of ProcessSet(process_set_id=0, ranks=all)", "dst is a rank, one of [0]"),
    (lambda: reduce.reduce_to(torch.ones(2), 0, ReduceOp.ADASUM, process_set=ALONE),
     "reduce does not support op=Adasum", "use op=Sum or Average."),
    (lambda: reduce.allreduce(torch.ones(2, dtype=torch.int32), ReduceOp.ADASUM, process_set=ALONE),
     "op=Adasum was asked for on a torch.int32 tensor", "cast to a floating dtype"),
    (lambda: reduce.allreduce(torch.ones(2), ReduceOp.ADASUM, process_set=Member([0, 1, 2], 0), check=False),
     "op=Adasum needs a power-of-two number of ranks, and this process set has 3", "run 2, 4, 8, ..."),
    (lambda: reduce.allreduce(torch.ones(2), "Mean", process_set=ALONE), "unknown reduction op 'Mean'", "use one of"),
    (lambda: reduce.allreduce(torch.ones(2), name="loss", process_set=ProcessSet([1])),
     "allreduce 'loss' on ProcessSet(process_set_id=None, ranks=[1]) was called on rank 0", "check ps.included()"),
    (lambda: reduce.grouped_allreduce([torch.ones(1), torch.ones(1)], process_set=ProcessSet([1])),
     "allreduce (grouped) on ProcessSet", "only on its member ranks"),
])
def test_refusals_say_what_and_how(run, says, hint):
    with pytest.raises(RingtrainError) as error:
        run()
    assert says in error.value.message and hint in error.value.hint
