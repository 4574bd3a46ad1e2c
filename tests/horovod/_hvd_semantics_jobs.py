"""Jobs for Horovod's semantics that Horovod's own test_torch.py checks (issue 11).

Each job runs many cases in one launch and returns raw values and error texts; the
tests (test_hvd_semantics.py) compute what they must be with plain torch on one process.
"""

from __future__ import annotations

import torch

import ringtrain.horovod as hvd
from ringtrain.comm import GLOBAL, named

LR = 0.1


def x_of(rank: int, salt: int, shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randn(*shape, generator=g)


def model_a() -> torch.nn.Module:
    torch.manual_seed(11)
    return torch.nn.Linear(3, 2)


def model_b() -> torch.nn.Module:
    torch.manual_seed(12)
    return torch.nn.Linear(4, 1)


def loss_a(model, rank: int, step: int):
    return model(x_of(rank, 10 + step, (5, 3))).square().mean()


def loss_b(model, rank: int, step: int):
    return model(x_of(rank, 50 + step, (6, 4))).sum()


def _error(call) -> str:
    try:
        call()
        return "no error"
    except Exception as e:  # noqa: BLE001 - the test inspects type and message
        return f"{type(e).__name__}|{isinstance(e, ValueError)}|{e}"


def named_and_errors() -> dict:
    """2 ranks: pairing by name, duplicate names, waits nobody can satisfy, sparse, alltoall, resync."""
    hvd.init()
    r = hvd.rank()
    out = {}
    a, b = torch.full((3,), float(r + 1)), torch.arange(4.0) * (r + 1)
    # submitted in different orders on the two ranks, paired by name
    if r == 0:
        ha, hb = hvd.allreduce_async(a, name="a", op=hvd.Sum), hvd.allreduce_async(b, name="b", op=hvd.Sum)
    else:
        hb, ha = hvd.allreduce_async(b, name="b", op=hvd.Sum), hvd.allreduce_async(a, name="a", op=hvd.Sum)
    out["polled_before"] = hvd.poll(ha)
    out["by_name"] = (hvd.synchronize(ha), hvd.synchronize(hb))

    # Horovod's duplicate-name pattern: rank 0 submits before a barrier, rank 1 after it
    x = torch.full((2,), float(r + 1))
    dup = {}
    if r == 0:
        held = hvd.allgather_async(x, name="dup")
        dup["second"] = _error(lambda: hvd.allgather_async(x, name="dup"))
    hvd.barrier()
    if r == 1:
        held = hvd.allgather_async(x, name="dup")
        dup["second"] = _error(lambda: hvd.allgather_async(x, name="dup"))
    hvd.barrier()
    dup["result"] = hvd.synchronize(held)
    dup["reuse"] = hvd.synchronize(hvd.allgather_async(x, name="dup"))  # free again once done
    out["dup"] = dup

    # every rank waits for a name the other has not submitted: both raise instead of hanging,
    # and submitting the missing names later pairs them up
    mine = hvd.allreduce_async(x, name="p" if r == 0 else "q", op=hvd.Sum)
    out["deadlock"] = _error(lambda: hvd.synchronize(mine))
    other = hvd.allreduce_async(x * 10, name="q" if r == 0 else "p", op=hvd.Sum)
    out["late_pair"] = (hvd.synchronize(mine), hvd.synchronize(other))

    # names given per step do not pile up: finished ones are forgotten
    for step in range(300):
        hvd.synchronize(hvd.allreduce_async(x, name=f"loss.{step}"))
    out["names_recorded"] = len(named.ops_of(GLOBAL).inflight)

    # sparse_allreduce_async returns something callable, as Horovod's does
    dense = torch.zeros(5, 3)
    dense[r] = r + 1.0
    dense[4] = 2.0 * (r + 1)
    handle = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse", op=hvd.Average)
    out["sparse_callable"] = callable(handle)
    result = handle()
    out["sparse"] = (result.is_sparse, result.to_dense())

    # alltoall's argument rules are Horovod's, and the errors ValueErrors
    t = torch.arange(10.0).reshape(5, 2) + 100 * r
    out["a2a_errors"] = {
        "float_splits": _error(lambda: hvd.alltoall(t, torch.tensor([1.0, 1.0]))),
        "int64_splits": _error(lambda: hvd.alltoall(t, torch.tensor([1, 1]))),
        "too_many_rows": _error(lambda: hvd.alltoall(t, torch.tensor([3, 3], dtype=torch.int32))),
        "uneven_no_splits": _error(lambda: hvd.alltoall(t)),
        "count": _error(lambda: hvd.alltoall(t, [1, 1, 1])),
    }
    out["a2a_fewer_rows"] = hvd.alltoall(t, torch.tensor([1, 2], dtype=torch.int32))

    # a failure on one rank only: rank 1 calls an allreduce while rank 0 is in a barrier;
    # rank 1 raises, rank 0 keeps waiting, and both are in step again afterwards
    if r == 1:
        out["asymmetric"] = _error(lambda: hvd.allreduce(torch.ones(3)))
    hvd.barrier()
    out["after_asymmetric"] = hvd.allreduce(torch.tensor([float(r + 1)]), op=hvd.Sum)

    # DistributedOptimizer without named_parameters: Horovod's names, unique across groups
    m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([{"params": m[0].parameters()}, {"params": m[1].parameters()}],
                                                   lr=0.1))
    out["noname"] = sorted(opt._parameter_names.values())
    hvd.shutdown()
    return out


def join_and_optimizers() -> dict:
    """2 ranks: join semantics, sparse gradients, one check per gradient layout, joined ranks serving
    steps of two alternating layouts."""
    hvd.init()
    r = hvd.rank()
    out = {}

    # rank 0 joins; rank 1's allgather/broadcast fail on rank 1 only, its allreduce and a named
    # allreduce get rank 0's zeros; join() returns the rank that joined last on both ranks
    if r == 0:
        out["join"] = hvd.join()
    else:
        out["allgather_while_joined"] = _error(lambda: hvd.allgather(torch.ones(2)))
        out["broadcast_while_joined"] = _error(lambda: hvd.broadcast(torch.ones(2), 1, name="bc"))
        out["allreduce_while_joined"] = hvd.allreduce(torch.tensor([4.0, 6.0]))  # Average over 2
        out["named_while_joined"] = hvd.synchronize(hvd.allreduce_async(torch.tensor([8.0]), name="n", op=hvd.Sum))
        out["join"] = hvd.join()

    # sparse gradients (nn.Embedding(sparse=True)) with SparseAdam, both sparse_as_dense settings
    for sparse_as_dense in (False, True):
        torch.manual_seed(3)
        emb = torch.nn.Embedding(6, 2, sparse=True)
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                                       sparse_as_dense=sparse_as_dense)
        idx = torch.tensor([[0, 1, 1], [3, 5, 0]]) if r == 0 else torch.tensor([[2, 1], [5, 5]])
        opt.zero_grad()
        emb(idx).sum().backward()
        opt.synchronize()
        grad = emb.weight.grad
        out[f"sparse_grad_{sparse_as_dense}"] = (grad.is_sparse, grad.to_dense().clone())
        with opt.skip_synchronize():
            opt.step()

    # one check per gradient layout: after the first step, steps run no check round
    a = model_a()
    opt_a = hvd.DistributedOptimizer(torch.optim.SGD(a.parameters(), lr=LR), named_parameters=a.named_parameters())
    rounds = []
    for step in range(3):
        before = GLOBAL.check_rounds
        opt_a.zero_grad()
        loss_a(a, r, step).backward()
        opt_a.step()
        rounds.append(GLOBAL.check_rounds - before)
    out["rounds_per_step"] = rounds

    # two optimizers stepped alternately (a layout switch each time); rank 1 joins after one step
    # of each, rank 0 goes on: A, A, B, A — each a switch or a repeat — then joins
    a, b = model_a(), model_b()
    opt_a = hvd.DistributedOptimizer(torch.optim.SGD(a.parameters(), lr=LR), named_parameters=a.named_parameters())
    opt_b = hvd.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=LR), named_parameters=b.named_parameters())
    plan = [("a", 0), ("b", 0)] + ([("a", 1), ("a", 2), ("b", 1), ("a", 3)] if r == 0 else [])
    for which, step in plan:
        model, opt, loss = (a, opt_a, loss_a) if which == "a" else (b, opt_b, loss_b)
        opt.zero_grad()
        loss(model, r, step).backward()
        opt.step()
    out["switch_join"] = hvd.join()
    out["switch_params"] = ([p.detach().clone() for p in a.parameters()], [p.detach().clone() for p in b.parameters()])
    out["after_join"] = hvd.allreduce(torch.tensor([float(r + 1)]), op=hvd.Sum)
    hvd.shutdown()
    return out


def three_ranks() -> dict:
    """3 ranks: a DistributedOptimizer on a process set (rank 2 outside it), and three joins."""
    hvd.init()
    r = hvd.rank()
    out = {}
    pair = hvd.add_process_set([0, 1])
    a = model_a()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(a.parameters(), lr=LR), named_parameters=a.named_parameters(),
                                   process_set=pair)
    opt.zero_grad()
    loss_a(a, r, 0).backward()
    opt.step()
    out["set_params"] = [p.detach().clone() for p in a.parameters()]
    hvd.remove_process_set(pair)

    # joins in the order 0, 2, 1; the others keep reducing meanwhile
    x = torch.tensor([float(r + 1)])
    if r == 0:
        out["join"] = hvd.join()
    elif r == 2:
        out["sum_while_0_joined"] = hvd.allreduce(x, op=hvd.Sum)
        out["join"] = hvd.join()
    else:
        out["sum_while_0_joined"] = hvd.allreduce(x, op=hvd.Sum)
        out["sum_while_0_2_joined"] = hvd.allreduce(x, op=hvd.Sum)
        out["join"] = hvd.join()
    hvd.shutdown()
    return out
