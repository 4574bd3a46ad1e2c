"""comm/state.py: the helpers that make every rank's state one rank's — parameters in one fused
broadcast per device, optimizer state split into a skeleton and its tensors and joined back, objects
pickled (cloudpickle: lambdas too), Horovod's one-step initialisation of a fresh optimizer — and the
refusals of what is not parameters."""

from __future__ import annotations

import pytest
import torch
from _comm_util import EngineSpy, Member

from ringtrain.comm import state
from ringtrain.comm.groups import ProcessSet
from ringtrain.errors import RingtrainError

ALONE = ProcessSet(None)


def test_objects_travel_pickled_lambdas_included():
    assert state._loads(state._dumps({"a": [1, 2.5], "b": None})) == {"a": [1, 2.5], "b": None}
    assert state._loads(state._dumps(lambda x: x + 1))(2) == 3
    assert state._dumps("x").dtype == torch.uint8


def test_alone_objects_come_back_as_they_are():
    obj = {"step": 3}
    assert state.broadcast_object(obj, process_set=ALONE) is obj
    assert state.allgather_object(obj, process_set=ALONE) == [obj]


def test_params_are_read_as_horovod_takes_them():
    a, b = torch.zeros(1), torch.ones(1)
    assert state._param_list({"z": a, "a": b}) == [("a", b), ("z", a)]  # a state_dict: by name
    assert state._param_list([("w", a), b]) == [("w", a), (None, b)]
    assert state._param_list(iter([a])) == [(None, a)]
    with pytest.raises(ValueError, match="invalid params of type: <class 'torch.Tensor'>"):
        state._param_list(a)


def test_broadcast_parameters_refuses_values_that_are_not_tensors():
    with pytest.raises(RingtrainError) as error:
        state.broadcast_parameters({"w": torch.zeros(1), "n": 3, "s": "x"}, 0, process_set=ALONE)
    assert error.value.message == "broadcast_parameters got non-tensor values (['int', 'str'])"
    assert error.value.hint == "pass model.state_dict(), model.named_parameters() or model.parameters()."


def test_optimizer_state_splits_into_a_skeleton_and_its_tensors_and_joins_back():
    t1, t2 = torch.ones(2, 3), torch.tensor([1], dtype=torch.int64)
    value = {"state": {0: {"momentum": t1, "step": t2, "k": 5}}, "groups": [{"lr": 0.1, "params": (0, 1)}]}
    tensors: list = []
    skeleton = state._split(value, tensors)
    assert len(tensors) == 2 and tensors[0] is t1 and tensors[1] is t2  # in order, the objects themselves
    assert skeleton["state"][0]["momentum"] == ("__tensor__", 0, "torch.float32", (2, 3), "cpu")
    assert skeleton["state"][0]["step"] == ("__tensor__", 1, "torch.int64", (1,), "cpu")
    assert skeleton["state"][0]["k"] == 5 and skeleton["groups"] == [{"lr": 0.1, "params": (0, 1)}]
    found: list = []
    state._collect(skeleton, found)
    assert [p[1] for p in found] == [0, 1]
    joined = state._join(skeleton, tensors)
    assert joined["state"][0]["momentum"] is t1 and joined["state"][0]["step"] is t2
    assert joined["groups"] == value["groups"]


def test_tensors_of_every_dtype_are_broadcast_in_one_fused_call_per_device(monkeypatch, engine):
    spy = EngineSpy(monkeypatch, "broadcast")
    tensors = [torch.arange(6.0).reshape(2, 3), torch.tensor([-1, 2], dtype=torch.int16), torch.tensor([True, False]),
               torch.empty(0, dtype=torch.float64), torch.tensor([1.5], dtype=torch.bfloat16)]
    before = [t.clone() for t in tensors]
    state.broadcast_tensors_(tensors, 0, process_set=Member([0, 1], 0), check=False)
    assert spy.shapes() == [(torch.uint8, 24 + 4 + 2 + 0 + 2)] and spy.calls[0]["src"] == 0
    assert all(torch.equal(t, b) and t.dtype == b.dtype for t, b in zip(tensors, before))  # bytes back in place
    state.broadcast_tensors_([], 0, process_set=Member([0, 1], 0), check=False)
    state.broadcast_tensors_(tensors, 0, process_set=ALONE)
    assert len(spy.calls) == 1  # nothing to send, or nobody to send it to


def test_initialize_state_steps_a_fresh_optimizer_once_on_zero_gradients():
    model = torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in model.parameters()]
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state.initialize_state(sgd)
    assert len(sgd.state) == 2 and all(torch.count_nonzero(s["momentum_buffer"]) == 0 for s in sgd.state.values())
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))  # zero gradients, no weight decay
    assert all(p.grad is not None and torch.count_nonzero(p.grad) == 0 for p in model.parameters())
    adam = torch.optim.Adam(model.parameters(), lr=0.1)
    state.initialize_state(adam)
    assert [float(s["step"]) for s in adam.state.values()] == [1.0, 1.0]  # Adam's count starts at 1, as in Horovod


def test_initialize_state_leaves_an_optimizer_with_state_alone():
    model = torch.nn.Linear(2, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    sgd.step()
    grads = [p.grad.clone() for p in model.parameters()]
    momentum = [s["momentum_buffer"].clone() for s in sgd.state.values()]
    state.initialize_state(sgd)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    assert all(torch.equal(s["momentum_buffer"], m) for s, m in zip(sgd.state.values(), momentum))


def test_sparse_gradients_where_horovod_makes_them():
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(4, 2, sparse=True), "lin": torch.nn.Linear(2, 1)})
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    state.initialize_state(sgd, model)
    assert model["emb"].weight.grad.is_sparse and not model["lin"].weight.grad.is_sparse
    emb = torch.nn.Embedding(4, 2, sparse=True)
    state.initialize_state(torch.optim.SparseAdam(emb.parameters()))
    assert emb.weight.grad.is_sparse


def test_alone_the_optimizer_state_broadcast_changes_nothing():
    model = torch.nn.Linear(2, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.3)
    state.broadcast_optimizer_state(sgd, 0, process_set=ALONE)
    assert sgd.state_dict()["state"] == {} and sgd.param_groups[0]["lr"] == 0.3
