"""SyncBatchNorm that also works on CPU / Gloo: batch statistics over every rank's batch.

torch's ``nn.SyncBatchNorm`` refuses CPU tensors ("expected input tensor to be on GPU"),
so a Gloo run would silently keep BatchNorm statistics per process. This module is the
same layer written as an ``autograd.Function`` over ``torch.distributed.all_reduce``:

* forward: per channel, ONE all_reduce of a packed ``[count | sum | sum of squares]``
  (float64, so counts are exact and ``E[x^2] - E[x]^2`` does not cancel), giving the
  global mean and biased variance (Ioffe & Szegedy 2015, Algorithm 1). Ranks with
  different or empty (N=0) batches still take part with their own count.
* backward: ONE all_reduce of ``[sum(dy) | sum(dy * x_hat)]``, then the standard
  BatchNorm input gradient with the global count (as torch/nn/modules/_functions.py
  ``SyncBatchNorm.backward`` / ``batch_norm_backward_elemt`` computes it):
  ``dx = w * invstd * (dy - sum(dy)/N - x_hat * sum(dy * x_hat)/N)``.
  Weight and bias gradients are the LOCAL sums: DDP averages them over W ranks like any
  parameter gradient, which is exactly right when each rank's loss is the mean over its
  own batch (W ranks x b with SyncBN == 1 process x W*b with plain BN).

Eval mode, no process group, or a world of one: plain ``F.batch_norm``, no communication.
CUDA tensors on an NCCL group go to torch's own ``nn.SyncBatchNorm`` path (fused kernels).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from ..errors import RingtrainError

try:  # the autograd.Function behind nn.SyncBatchNorm (CUDA only); ours is used if it moves
    from torch.nn.modules._functions import SyncBatchNorm as _TorchSyncBN
except ImportError:  # pragma: no cover
    _TorchSyncBN = None

_PLAIN = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
_DIM_OF_INPUT = {2: 1, 3: 1, 4: 2, 5: 3}  # input.dim() -> BatchNorm{1,2,3}d


def _reduce_dims(x: torch.Tensor) -> list[int]:
    return [0, *range(2, x.dim())]  # every dim but channels


def _per_channel(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return t.reshape(1, -1, *([1] * (x.dim() - 2)))  # (C,) -> broadcastable against x


class _SyncBatchNormFunction(torch.autograd.Function):
    """Training-mode BatchNorm over a process group (Gloo or any backend with all_reduce SUM)."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group):
        channels = x.shape[1]
        compute = torch.promote_types(x.dtype, torch.float32)  # half inputs are computed in float32
        xc = x.to(compute)
        local = x.numel() // channels if channels else 0
        # Local mean and M2 by torch's two-pass var_mean (accurate in float32), turned into
        # sums in float64: the global E[x^2] - E[x]^2 then loses nothing to cancellation.
        if local > 0:
            var_l, mean_l = torch.var_mean(xc, _reduce_dims(x), correction=0)
            mean_l, var_l = mean_l.double(), var_l.double()
            sums, sumsq = mean_l * local, (var_l + mean_l * mean_l) * local
        else:  # empty batch: contribute count 0, but DO take part so no peer hangs
            sums = sumsq = torch.zeros(channels, dtype=torch.float64, device=x.device)
        count = torch.full((1,), float(local), dtype=torch.float64, device=x.device)
        packed = torch.cat([count, sums, sumsq])
        dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
        total = packed[0].item()
        if total < 2:
            # Every rank sees the same total, so every rank raises: nobody is left waiting.
            raise RingtrainError(
                f"SyncBatchNorm got {int(total)} value(s) per channel over all ranks in training mode",
                "batch statistics need at least 2 values per channel: use bigger batches, or model.eval().",
            )
        mean = packed[1 : channels + 1] / total
        var = (packed[channels + 1 :] / total - mean * mean).clamp_min(0.0)  # biased: used to normalize
        invstd = torch.rsqrt(var + eps)

        if running_mean is not None:
            # Exactly nn.BatchNorm's update: the UNBIASED variance goes into running_var.
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
            unbiased = var * (total / (total - 1))
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)

        mean_c, invstd_c = mean.to(compute), invstd.to(compute)
        y = (xc - _per_channel(mean_c, x)) * _per_channel(invstd_c, x)
        if weight is not None:
            y = y * _per_channel(weight.to(compute), x)
        if bias is not None:
            y = y + _per_channel(bias.to(compute), x)
        ctx.save_for_backward(x, weight, mean_c, invstd_c)
        ctx.total = total
        ctx.group = group
        ctx.has_bias = bias is not None
        return y.to(x.dtype)

    @staticmethod
    @once_differentiable  # like torch's: a second derivative raises instead of being wrong
    def backward(ctx, grad_out):
        x, weight, mean, invstd = ctx.saved_tensors
        compute = mean.dtype
        dims = _reduce_dims(x)
        dy = grad_out.to(compute)
        x_hat = (x.to(compute) - _per_channel(mean, x)) * _per_channel(invstd, x)
        sum_dy = dy.sum(dims, dtype=torch.float64)
        sum_dy_xhat = (dy * x_hat).sum(dims, dtype=torch.float64)

        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            # Every rank computes an input gradient (same model, same graph), so every rank
            # reaches this all_reduce; the packed copy leaves the local sums for w/b grads.
            packed = torch.cat([sum_dy, sum_dy_xhat])
            dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=ctx.group)
            channels = mean.numel()
            mean_dy = (packed[:channels] / ctx.total).to(compute)
            mean_dy_xhat = (packed[channels:] / ctx.total).to(compute)
            scale = invstd if weight is None else invstd * weight.to(compute)
            grad_input = (dy - _per_channel(mean_dy, x) - x_hat * _per_channel(mean_dy_xhat, x)) * _per_channel(
                scale, x
            )
            grad_input = grad_input.to(x.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = sum_dy_xhat.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = sum_dy.to(weight.dtype if weight is not None else compute)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics cover the whole process group, on CPU/Gloo too.

    Same arguments as ``nn.SyncBatchNorm``; accepts (N, C), (N, C, L), (N, C, H, W) and
    (N, C, D, H, W) input. Without a process group (or with one rank) it is plain
    BatchNorm. In eval mode it uses the running statistics and never communicates, so
    evaluating on one rank alone is safe.
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Any | None = None,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ) -> None:
        # bias=False only exists in newer torch: pass it only when asked for.
        extra = {} if bias else {"bias": False}
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, **extra)
        self.process_group = process_group
        # Which BatchNorm{1,2,3}d this layer reverts to: set by convert, else by the first input seen.
        self.bn_dim: int | None = None

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() not in _DIM_OF_INPUT:
            raise RingtrainError(
                f"SyncBatchNorm got a {input.dim()}D input of shape {tuple(input.shape)}",
                "pass (N, C), (N, C, L), (N, C, H, W) or (N, C, D, H, W) input.",
            )
        if input.shape[1] != self.num_features:
            raise RingtrainError(
                f"SyncBatchNorm({self.num_features}) got {input.shape[1]} channels (input shape {tuple(input.shape)})",
                "channels are dim 1: check the layer's num_features, or permute the input to (N, C, ...).",
            )

    def _group(self) -> Any:
        return dist.group.WORLD if self.process_group is None else self.process_group

    def _sync_world(self) -> int:
        if not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size(self._group())

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if self.bn_dim is None:
            self.bn_dim = _DIM_OF_INPUT[input.dim()]
        # Momentum and the batch counter exactly as nn.BatchNorm (torch/nn/modules/batchnorm.py):
        # momentum=None is the cumulative average 1 / num_batches_tracked.
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        # Batch statistics in training, and in eval when there are no running buffers.
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        tracked = not self.training or self.track_running_stats
        running_mean = self.running_mean if tracked else None
        running_var = self.running_var if tracked else None

        # Only training mode talks to other ranks: eval (frozen BN included) never does.
        if not (bn_training and self.training) or self._sync_world() == 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, bn_training, factor, self.eps)
        group = self._group()
        if input.is_cuda and _TorchSyncBN is not None and dist.get_backend(group) == "nccl":
            # NCCL on CUDA: torch's own function (fused CUDA kernels, channels_last);
            # it updates the running buffers with the same factor, as nn.SyncBatchNorm does.
            return _TorchSyncBN.apply(
                input, self.weight, self.bias, running_mean, running_var, self.eps, factor, group, self._sync_world()
            )
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, running_mean, running_var, self.eps, factor, group
        )

    def extra_repr(self) -> str:
        return super().extra_repr() + ("" if self.bn_dim is None else f", bn_dim={self.bn_dim}")

    @classmethod
    def convert_sync_batchnorm(cls, module: nn.Module, process_group: Any | None = None) -> nn.Module:
        """Same as :func:`convert_sync_batchnorm` (the name ``nn.SyncBatchNorm`` users know)."""
        return convert_sync_batchnorm(module, process_group)


def _bn_dim(module: nn.Module) -> int:
    for dim, kind in _PLAIN.items():
        if isinstance(module, kind):
            return dim
    raise TypeError(type(module).__name__)


def _swap(old: nn.modules.batchnorm._BatchNorm, new: nn.modules.batchnorm._BatchNorm) -> nn.Module:
    """Give ``new`` the very tensors of ``old``: same Parameters (an optimizer built before still
    points at them, requires_grad kept), same buffers, training mode; state dict keys unchanged."""
    if old.affine:
        new.weight = old.weight
        new.bias = old.bias
    new.running_mean = old.running_mean
    new.running_var = old.running_var
    new.num_batches_tracked = old.num_batches_tracked
    new.train(old.training)
    if hasattr(old, "qconfig"):
        new.qconfig = old.qconfig
    return new


def _bias_kwargs(module: nn.modules.batchnorm._BatchNorm) -> dict[str, bool]:
    return {"bias": False} if module.affine and module.bias is None else {}


def convert_sync_batchnorm(module: nn.Module, process_group: Any | None = None) -> nn.Module:
    """Replace every BatchNorm1d/2d/3d in ``module`` (recursively) with :class:`SyncBatchNorm`.

    Weights, buffers, requires_grad flags, training mode and child names are kept, so
    state dicts are interchangeable with the plain model. Returns the converted module
    (a new object when ``module`` itself is a BatchNorm layer, as in torch).
    """
    out = module
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)) and not isinstance(module, SyncBatchNorm):
        out = SyncBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
            process_group,
            **_bias_kwargs(module),
        )
        out.bn_dim = _bn_dim(module)
        _swap(module, out)
    for name, child in module.named_children():
        out.add_module(name, convert_sync_batchnorm(child, process_group))
    return out


def revert_sync_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every :class:`SyncBatchNorm` in ``module`` with plain BatchNorm{1,2,3}d (e.g. for export).

    The dimension comes from the layer's ``bn_dim``: recorded by ``convert_sync_batchnorm``,
    or from the first input the layer saw.
    """
    out = module
    if isinstance(module, SyncBatchNorm):
        if module.bn_dim not in _PLAIN:
            raise RingtrainError(
                f"cannot tell whether {module} should become BatchNorm1d, 2d or 3d",
                "run one forward pass first, or set layer.bn_dim = 1, 2 or 3 before reverting.",
            )
        out = _PLAIN[module.bn_dim](
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
            **_bias_kwargs(module),
        )
        _swap(module, out)
    for name, child in module.named_children():
        out.add_module(name, revert_sync_batchnorm(child))
    return out
