"""``hvd.DistributedOptimizer`` with Horovod's signature and defaults (horovod/torch/optimizer.py, 0.28)."""

from __future__ import annotations

import warnings

from .. import comm
from ..comm import Compression
from .basics import Average, global_process_set, require_init, resolve


def _split_list(items: list, parts: int) -> list[list]:
    """Horovod's ``split_list``: ``parts`` nearly equal consecutive pieces."""
    d, r = divmod(len(items), parts)
    return [items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(parts)]


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,  # noqa: N802 (Horovod's name)
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                         groups=None, sparse_as_dense=False, process_set=global_process_set):
    """Wrap ``optimizer`` so gradients are averaged across ranks during backward (see ``ringtrain.comm.optimizer``).

    * ``compression``: ``Compression.fp16`` sends floating gradients as float16.
    * ``backward_passes_per_step``: gradients accumulate locally and are reduced every
      that many backward passes (divide your loss accordingly, as in Horovod).
    * ``op``: Average (default), Sum, or Adasum (delta-optimizer semantics).
    * ``gradient_predivide_factor``: gradients are scaled by 1/f before the sum and by
      f/size after it (op=Average only).
    * ``groups`` / ``num_groups``: explicit fusion groups (a list of parameter lists, or
      a number of equal groups); otherwise buckets follow HOROVOD_FUSION_THRESHOLD.
    * ``sparse_as_dense``: sparse gradients are always reduced as dense here and written back
      sparse (the sum equals Horovod's allgather of indices and values).
    * ``process_set``: ranks outside it get an optimizer that steps on their own gradients.
    """
    rt = require_init()
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if isinstance(groups, int):
        if groups <= 0:
            raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
        groups = [g for g in _split_list(params, groups) if g]
    elif groups is not None:
        if not all(isinstance(g, (list, tuple)) for g in groups):
            raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
    return comm.distributed_optimizer(
        optimizer, named_parameters, compression=compression, backward_passes_per_step=backward_passes_per_step,
        op=op, gradient_predivide_factor=gradient_predivide_factor, groups=groups,
        process_set=resolve(process_set), fusion_threshold=rt.fusion_threshold, check=rt.checks,
    )
