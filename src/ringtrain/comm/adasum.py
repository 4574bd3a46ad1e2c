"""Adasum: combine gradients so that parallel directions average and orthogonal ones add.

Horovod's pairwise rule (Maleki et al., "Scaling Distributed Training with Adaptive
Summation", MLSys 2021; horovod/common/ops/adasum/adasum.h ``FusedPairwiseReduceWithComm``),
applied per tensor::

    adasum(a, b) = (1 - a·b / (2‖a‖²)) · a + (1 - a·b / (2‖b‖²)) · b

with a coefficient of 1 when a squared norm is below sqrt(DBL_MIN), dot products and
norms accumulated in float64, and the scaled add computed in float64 before rounding
back to the tensor's dtype — all as in Horovod's CPU kernel.

Over 2^k ranks the rule is applied along a binary tree: at level 1 ranks 0+1, 2+3 ...
combine, at level 2 the pairs' results combine, and so on (Horovod's VHDD order:
partner = rank XOR level). Horovod splits vectors in halves while doing this to save
bandwidth; here each level exchanges whole vectors with the partner (recursive
doubling), which gives the same tree and the same formula on every rank with less
code. The lower rank's vector is always ``a``, so both partners compute bit-identical
results. Other rank counts raise, as Horovod does.
"""

from __future__ import annotations

import math
import sys

import torch
import torch.distributed as dist

from ..errors import RingtrainError
from ..liveness.activity import waits_for_peers
from .groups import ProcessSet

_TINY = math.sqrt(sys.float_info.min)  # sqrt(DBL_MIN), Horovod's threshold
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_size(ps: ProcessSet) -> RingtrainError | None:
    n = ps.size()
    if n & (n - 1):
        return RingtrainError(
            f"op=Adasum needs a power-of-two number of ranks, and this process set has {n}",
            "run 2, 4, 8, ... processes, or use op=Average.",
        )
    return None


def check_dtype(dtype: torch.dtype) -> RingtrainError | None:
    if dtype not in FLOAT_DTYPES:
        return RingtrainError(
            f"op=Adasum was asked for on a {dtype} tensor; Adasum combines floating-point tensors only",
            "cast to a floating dtype, or use op=Sum/Average for integers.",
        )
    return None


def pair(a: torch.Tensor, b: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """``adasum(a, b)`` for each segment of the flat vectors ``a`` and ``b`` (float64 math)."""
    out = torch.empty_like(a)
    start = 0
    for size in sizes:
        sa = a[start:start + size].double()
        sb = b[start:start + size].double()
        dot = float(torch.dot(sa, sb))
        anorm = float(torch.dot(sa, sa))
        bnorm = float(torch.dot(sb, sb))
        acoeff = 1.0 - dot / anorm * 0.5 if anorm >= _TINY else 1.0
        bcoeff = 1.0 - dot / bnorm * 0.5 if bnorm >= _TINY else 1.0
        out[start:start + size] = (acoeff * sa + bcoeff * sb).to(a.dtype)
        start += size
    return out


def combine(vectors: list[torch.Tensor], sizes: list[int]) -> torch.Tensor:
    """The tree combination of every rank's flat vector, by hand (tests use it as the reference)."""
    level = list(vectors)
    while len(level) > 1:
        level = [pair(level[i], level[i + 1], sizes) for i in range(0, len(level), 2)]
    return level[0]


@waits_for_peers(lambda frame: "allreduce (Adasum)")
def adasum_(tensors: list[torch.Tensor], ps: ProcessSet) -> None:
    """Replace each tensor (same dtype and device) with the Adasum of its values on all members."""
    n = ps.size()
    if n == 1 or not tensors:
        return
    sizes = [t.numel() for t in tensors]
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    me = ps.rank()
    group = ps.group_for(flat)
    level = 1
    while level < n:
        partner = ps.global_rank(me ^ level)
        received = torch.empty_like(flat)
        # One batch, not isend + blocking recv: on NCCL a pair's send and receive share one
        # stream and a send completes only when the peer's receive runs, so two ranks each
        # sending first would wait on each other forever. A batch lets the backend post both
        # together (NCCL groups them; Gloo just issues them, giving the same bits as before).
        works = dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, flat, partner, group=group), dist.P2POp(dist.irecv, received, partner, group=group)]
        )
        for work in works:
            work.wait()
        lower, upper = (flat, received) if me & level == 0 else (received, flat)
        flat = pair(lower, upper, sizes)
        level <<= 1
    start = 0
    for t, size in zip(tensors, sizes):
        t.copy_(flat[start:start + size].view_as(t))
        start += size
