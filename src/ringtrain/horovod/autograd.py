"""Gradients through the collectives, exactly as Horovod defines them (horovod/torch/mpi_ops.py).

* allreduce: the gradient is an allreduce of the incoming gradient with the same op
  and the same pre/post scale factors.
* allgather: an averaged allreduce of the incoming gradient, narrowed to this
  rank's rows.
* broadcast: an averaged allreduce on the root rank, zero on every other rank.
* alltoall: the reverse alltoall (received splits become send splits).
* reducescatter: an allgather of the incoming gradient, multiplied by the set size
  for op=Sum and by the scale factors (Horovod's ``_reducescatter_grad``,
  horovod/tensorflow/mpi_ops.py; the torch binding follows the same rule).
"""

from __future__ import annotations

import torch

from .. import comm
from .basics import RUNTIME, Average, Sum


def _check() -> bool:
    return RUNTIME.checks


class Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, prescale, postscale, process_set, name):
        ctx.args = (op, prescale, postscale, process_set)
        return comm.allreduce(tensor, op, prescale=prescale, postscale=postscale, process_set=process_set,
                              check=_check(), name=name).wait()

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set = ctx.args
        return Allreduce.apply(grad.contiguous(), op, prescale, postscale, process_set, None), None, None, None, None, None


class GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, prescale, postscale, process_set, name, *tensors):
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(comm.grouped_allreduce(tensors, op, prescale=prescale, postscale=postscale,
                                            process_set=process_set, check=_check(), name=name).wait())

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set = ctx.args
        reduced = GroupedAllreduce.apply(op, prescale, postscale, process_set, None, *[g.contiguous() for g in grads])
        return (None, None, None, None, None, *reduced)


class Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, process_set, name):
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        ctx.process_set = process_set
        return comm.allgather(tensor, process_set=process_set, check=_check(), name=name).wait()

    @staticmethod
    def backward(ctx, grad):
        ps = ctx.process_set
        reduced = Allreduce.apply(grad.contiguous(), Average, 1.0, 1.0, ps, None)
        rows = comm.allgather(torch.tensor([ctx.rows]), process_set=ps, check=_check()).wait().tolist()
        offset = sum(rows[:ps.rank()])
        return reduced.narrow(0, offset, ctx.rows), None, None


class Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, process_set, name):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return comm.broadcast(tensor, root_rank, process_set=process_set, check=_check(), name=name).wait()

    @staticmethod
    def backward(ctx, grad):
        reduced = Allreduce.apply(grad.contiguous(), Average, 1.0, 1.0, ctx.process_set, None)
        if ctx.process_set.global_rank(ctx.process_set.rank()) != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


class Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, process_set, name):
        output, received = comm.alltoall(tensor, splits, process_set=process_set, check=_check(), name=name).wait()
        ctx.process_set, ctx.received = process_set, received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, _unused):
        back, _ = comm.alltoall(grad.contiguous(), ctx.received, process_set=ctx.process_set, check=_check()).wait()
        return back, None, None, None


class Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, prescale, postscale, process_set, name):
        ctx.args = (op, prescale, postscale, process_set)
        return comm.reducescatter(tensor, op, prescale=prescale, postscale=postscale, process_set=process_set,
                                  check=_check(), name=name).wait()

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set = ctx.args
        grad = grad.contiguous()
        if op == Sum:
            grad = grad * process_set.size()
        if prescale != 1.0:
            grad = grad * prescale
        if postscale != 1.0:
            grad = grad * postscale
        return Allgather.apply(grad, process_set, None), None, None, None, None, None
