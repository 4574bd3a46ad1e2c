"""comm/optimizer.py: the DistributedOptimizer is the user's optimizer class (same groups and state),
synchronize / skip_synchronize / the double-synchronize warning, Horovod's parameter-name rules and
ValueErrors, the delta optimizer for Adasum, local steps, and the refusals."""

from __future__ import annotations

import warnings

import pytest
import torch
from _comm_util import Member

from ringtrain.comm import optimizer
from ringtrain.comm.groups import ProcessSet
from ringtrain.comm.ops import ReduceOp
from ringtrain.errors import RingtrainError

ALONE = ProcessSet(None)


def sgd(model, lr=0.1):
    return torch.optim.SGD(model.parameters(), lr=lr)


def test_it_is_the_users_class_sharing_groups_and_state():
    model = torch.nn.Linear(2, 1)
    plain = torch.optim.Adam(model.parameters(), lr=0.01)
    wrapped = optimizer.distributed_optimizer(plain, process_set=ALONE)
    assert isinstance(wrapped, torch.optim.Adam) and type(wrapped).__name__ == "Adam"
    assert wrapped.param_groups is plain.param_groups and wrapped.state is plain.state
    assert optimizer.is_distributed(wrapped) and not optimizer.is_distributed(plain)
    again = optimizer.distributed_optimizer(torch.optim.Adam(model.parameters()), process_set=ALONE)
    assert type(again) is type(wrapped)  # one derived class per optimizer class


def test_alone_a_step_is_the_plain_step():
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    opt = optimizer.distributed_optimizer(sgd(model), process_set=ALONE)
    model(torch.tensor([[1.0, 3.0]])).sum().backward()
    opt.step()
    assert torch.allclose(model.weight, torch.tensor([[0.9, 1.7]]))
    assert opt.backward_passes_per_step == 1
    opt.set_backward_passes_per_step(4)
    assert opt.backward_passes_per_step == 4


def test_a_step_after_synchronize_outside_skip_synchronize_warns():
    model = torch.nn.Linear(2, 1)
    opt = optimizer.distributed_optimizer(sgd(model), process_set=ALONE)
    model(torch.ones(1, 2)).sum().backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="gradients are synchronized twice"):
        opt.step()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opt.skip_synchronize():
            opt.step()
        opt.step()  # synchronize() is called again by step() now, without a warning
    assert [str(w.message) for w in caught] == []


def test_local_step_is_the_classes_own_step():
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = optimizer.distributed_optimizer(sgd(model, lr=0.5), process_set=ALONE)
    model.weight.grad = torch.tensor([[2.0]])
    optimizer.local_step(opt)
    assert model.weight.item() == 0.0
    plain = sgd(model, lr=1.0)
    optimizer.local_step(plain)
    assert model.weight.item() == -2.0


def test_default_names_are_unique_across_groups():
    a, b, c = (torch.nn.Parameter(torch.zeros(1)) for _ in range(3))
    opt = torch.optim.SGD([{"params": [a, b]}, {"params": [c]}], lr=0.1)
    names = optimizer._names(opt, None)
    assert names == {id(a): "allreduce.noname.0.0", id(b): "allreduce.noname.0.1", id(c): "allreduce.noname.1.0"}
    assert optimizer._names(opt, [("a", a), ("b", b), ("c", c)]) == {id(a): "a", id(b): "b", id(c): "c"}


def test_horovods_value_errors_for_named_parameters():
    model = torch.nn.Linear(2, 1)
    opt = sgd(model)
    w, b = model.weight, model.bias
    with pytest.raises(ValueError, match=r"named_parameters should be a sequence of tuples \(name, parameter\)"):
        optimizer._names(opt, [w, b])
    with pytest.raises(ValueError, match="Parameter names in named_parameters must be unique. Found duplicates: x"):
        optimizer._names(opt, [("x", w), ("x", b)])
    with pytest.raises(ValueError, match=f"one or more model parameters were not named. Python object ids: {id(b)}"):
        optimizer._names(opt, [("w", w)])
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with op != Average"):
        optimizer.distributed_optimizer(opt, op=ReduceOp.SUM, gradient_predivide_factor=2.0, process_set=ALONE)


def test_what_is_not_a_plain_optimizer_is_refused():
    model = torch.nn.Linear(2, 1)
    with pytest.raises(RingtrainError) as error:
        optimizer.distributed_optimizer(model, process_set=ALONE)
    assert error.value.message == "DistributedOptimizer got a Linear"
    assert "pass a torch.optim.Optimizer" in error.value.hint
    wrapped = optimizer.distributed_optimizer(sgd(model), process_set=ALONE)
    with pytest.raises(RingtrainError) as error:
        optimizer.distributed_optimizer(wrapped, process_set=ALONE)
    assert str(error.value) == ("DistributedOptimizer got an optimizer that is already distributed\n"
                                "HINT: wrap the plain optimizer once.")


def test_adasum_on_several_ranks_is_the_delta_optimizer_without_skip_synchronize():
    model = torch.nn.Linear(2, 1)
    opt = optimizer.distributed_optimizer(sgd(model), op=ReduceOp.ADASUM, process_set=Member([0, 1], 0))
    assert isinstance(opt, optimizer._DistributedAdasum) and isinstance(opt, torch.optim.SGD)
    assert opt.synchronize() is None and optimizer.is_distributed(opt)
    with pytest.raises(RingtrainError) as error:
        with opt.skip_synchronize():
            pass
    assert "skip_synchronize() was used with op=Adasum" in str(error.value)
    assert "HINT: Adasum combines updates inside step()" in str(error.value)
    alone = optimizer.distributed_optimizer(sgd(model), op=ReduceOp.ADASUM, process_set=ALONE)
    assert isinstance(alone, optimizer._Distributed)  # one rank: nothing to combine, a plain step


def test_outside_the_set_the_optimizer_has_no_hooks_and_steps_on_its_own_gradients():
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = optimizer.distributed_optimizer(sgd(model), process_set=ProcessSet([1, 2]))
    assert opt._sync._hooks == [] and not opt._sync.member
    model(torch.tensor([[2.0]])).sum().backward()
    opt.step()
    assert model.weight.item() == pytest.approx(0.8)
