"""Tensor parallelism (Megatron-LM's, Shoeybi et al. 2019): each rank of a group holds 1/N of every cut layer and
computes its part of each matmul; activations are exchanged inside the group every layer.

The engine is torch's: ``parallelize_module`` with ColwiseParallel / RowwiseParallel / SequenceParallel on the job
mesh's ``tp`` dimension (DTensor). This file holds the strategy and what a data-parallel strategy composes with:

* ``rt.strategies.TP(N, plan=None, sequence_parallel=False)`` — tensor parallelism alone, over N = W ranks; every
  rank reads the same batch (``data_parallel_size`` is 1);
* ``rt.strategies.DDP(tp=N)`` / ``rt.strategies.FSDP(tp=N)`` (``replicate=`` for HSDP) — W/N data-parallel
  replicas of a TP group of N neighbouring ranks, the mesh ``(dp..., tp)``; TP is applied first, then the data
  dimension on its sub-mesh (torchtitan's order: TP, then activation checkpointing and compile, then FSDP).
  ``tp=`` takes N or a ``TP(N, plan=..., sequence_parallel=...)``.

The plan is inferred for the usual shapes or given as torch's plan (_tp_plan.py) and printed once, as a table, by
the main process; what it leaves out is replicated (_tp_apply.py). After the first optimizer step the replicated
parameters are checked to agree across each TP group (_tp_guard.py): a plan that misses a module is loud, not a
silent drift. Checkpoints hold the unsplit model's names and shapes: the parameters are DTensors, which the sharded
folders (the default) and full files (``gather_full``) already read and write at any layout.

Every rank starts from rank 0's weights (broadcast before the plan cuts them). After ``ring.setup`` the ranks of a
TP group draw the same random numbers (``seed_rank``): dropout where activations are replicated must agree.
"""

from __future__ import annotations

from typing import Any, ContextManager

import torch
import torch.distributed as dist
from torch import nn

from ..errors import RingtrainError
from ..parallel.mesh import TP as TP_DIM, Layout
from . import _tp_apply, _tp_guard, _tp_plan, materialize
from ._evaluation import EvaluationTogether
from .base import Distributed


def _size(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RingtrainError(f"{what} got tp={value!r}", "tp is the number of ranks in a tensor-parallel group "
                             "(a positive integer, e.g. the GPUs of one node), or an rt.strategies.TP(N, ...).")
    return value


class TP(Distributed):
    """``rt.strategies.TP(size=None, plan=None, sequence_parallel=False)``: tensor parallelism over ``size`` ranks
    (None: every process started).

    ``plan``: torch's ``parallelize_module`` plan — module names or fnmatch patterns (``"blocks.*.mlp.fc1"``) to
    ParallelStyles — or None to infer one (attention q/k/v column-wise and its output row-wise, MLP up/down pairs,
    embeddings row-wise, the output head column-wise); ``sequence_parallel``: also cut the residual stream between
    the blocks along the sequence (dim 1), with norms and dropouts on SequenceParallel (inferred plans only: a plan
    of your own says it itself).
    """

    name = "tp"
    shards_state = True  # cut parameters: checkpoints are sharded folders by default
    backward_syncs = True  # the backward exchanges activation gradients within the group

    def __init__(self, size: int | None = None, plan: dict[str, Any] | None = None, sequence_parallel: bool = False):
        super().__init__()
        self.size = _size(size, "TP")
        if plan is not None and not isinstance(plan, dict):
            raise RingtrainError(f"TP got plan={plan!r}", "give a dict of module names (or patterns) to torch "
                                 "ParallelStyles, or plan=None for the inferred plan.")
        if plan is not None and sequence_parallel:
            raise RingtrainError("TP got a plan and sequence_parallel=True",
                                 "a plan of your own sets the layouts itself (SequenceParallel() on the norms, "
                                 "input/output layouts Shard(1)); drop sequence_parallel=True.")
        if not isinstance(sequence_parallel, bool):
            raise RingtrainError(f"TP got sequence_parallel={sequence_parallel!r}", "use True or False.")
        self.plan, self.sequence_parallel = plan, sequence_parallel
        self.applied: list[_tp_apply.Plan] = []  # each model's plan as applied (tests, messages)
        self.guards = _tp_guard.Guards()

    def __repr__(self) -> str:
        shown = [repr(self.size)] if self.size is not None else []
        shown += ["plan={...}"] if self.plan is not None else []
        shown += ["sequence_parallel=True"] if self.sequence_parallel else []
        return f"TP({', '.join(shown)})"

    # --- as a strategy of its own: every rank in one group ------------------------------------
    def check_job(self) -> None:
        world = self.env.world_size
        if self.size is not None and self.size != world:
            raise RingtrainError(
                f"TP({self.size}) alone runs on {self.size} processes, and {world} were started",
                f"start {self.size} processes, or give the other ranks data parallelism: "
                f"rt.strategies.DDP(tp={self.size}) or rt.strategies.FSDP(tp={self.size}) "
                f"({world // self.size if world % self.size == 0 else 'W/tp'} replicas of {self.size} ranks).")
        super().check_job()

    def layout(self) -> Layout:
        return Layout(((TP_DIM, self.world_size),))

    def configure(self, *, accumulate: int = 1, nonfinite: str = "raise", sync_batchnorm: bool = False) -> None:
        refuse_sync_batchnorm(sync_batchnorm, "TP")

    def setup_module(self, module: nn.Module, precision: Any, **options: Any) -> nn.Module:
        refuse_precision(precision, "TP")
        self.cut(module, self.mesh[TP_DIM], self.device)
        self.blocks.apply(module)  # after the cut (compiling.py)
        precision.wrap_forward(module)
        self.watch(module, self.mesh[TP_DIM])
        together(self, module)
        return module

    def wrap_module(self, module: nn.Module, **options: Any) -> nn.Module:
        self.cut(module, self.mesh[TP_DIM], self.device)
        self.blocks.apply(module)
        self.watch(module, self.mesh[TP_DIM])
        return module

    def step_context(self, optimizer: torch.optim.Optimizer) -> ContextManager:
        return self.guards.after_step(optimizer)

    def clip_grad_norm_(self, module: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        return clip_grad_norm_(module, max_norm, norm_type)

    # --- as one dimension of the mesh (DDP(tp=N), FSDP(tp=N) call these) ----------------------
    def cut(self, module: nn.Module, mesh: Any, device: torch.device, broadcast: Any = None) -> None:
        """``module`` on ``device`` with rank 0's weights, cut in place by the plan over ``mesh`` (the ``tp``
        sub-mesh); the plan's table printed by the main process. ``broadcast(tensor)``: gives a tensor the values
        the shards come from (a pipeline's: its stage's first rank's); rank 0's by default."""
        if materialize.on_meta(module):
            raise RingtrainError(
                "tensor parallelism got a model built on the meta device",
                "build it on the CPU (tensor parallelism cuts whole weights: rank 0's, sent to every rank); "
                "a model too large for that needs FSDP without tp= for now.")
        module.to(device)
        for t in (*module.parameters(), *module.buffers()):
            # every rank cuts the same weights (a replicated module keeps them)
            dist.broadcast(t.data, src=0) if broadcast is None else broadcast(t.data)
        degree = mesh.size()
        plan = (_tp_plan.given(module, self.plan) if self.plan is not None
                else _tp_plan.infer(module, degree, self.sequence_parallel))
        _tp_apply.apply(module, plan, mesh, degree)
        self.applied.append(plan)
        if dist.get_rank() == 0:
            print(_tp_plan.table(module, plan, degree, self.sequence_parallel), flush=True)

    def watch(self, module: nn.Module, mesh: Any, params: Any = None) -> None:
        """Check ``module``'s TP-replicated parameters after its optimizer's first step (``params``: the strategy's
        ``named_parameters`` of it, read then)."""
        self.guards.watch(params or _tp_guard.named(module), mesh.get_group(), self.sequence_parallel)


def of(tp: Any, what: str) -> TP | None:
    """``tp=`` of DDP/FSDP as a TP component: None for no tensor parallelism (None, 1, TP(1))."""
    if isinstance(tp, TP):
        if tp.size is None:
            raise RingtrainError(f"{what}(tp=TP()) needs the group's size", f"write {what}(tp=TP(2, ...)).")
        return tp if tp.size > 1 else None
    size = _size(tp, what)
    return TP(size) if size is not None and size > 1 else None


def shown(tp: TP | None) -> Any:
    """``tp=`` as a repr shows it: the size alone where the TP object has no other option."""
    return None if tp is None else tp.size if repr(tp) == f"TP({tp.size})" else tp


def refuse_sync_batchnorm(sync_batchnorm: bool, what: str) -> None:
    if sync_batchnorm:
        raise RingtrainError(f"sync_batchnorm=True with tensor parallelism ({what})",
                             "the ranks of a TP group see the same samples: drop sync_batchnorm, or use "
                             "rt.strategies.DDP() without tp=.")


def refuse_precision(precision: Any, what: str) -> None:
    if getattr(precision, "dtype", None) is torch.float16:
        raise RingtrainError(f"precision='16-mixed' with tensor parallelism ({what})",
                             "use precision='bf16-mixed' (no loss scaling over DTensor gradients) or '32'.")


def clip_grad_norm_(module: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """torch's clipping over DTensor gradients (every parameter is one on the same mesh: _tp_apply), the norm whole."""
    norm = torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm, norm_type=norm_type)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def together(strategy: Any, module: nn.Module) -> None:
    """An evaluation on some ranks alone would wait in the group's exchanges for ranks that are elsewhere: every
    forward under torch.no_grad meets the others first (_evaluation.py), named when one does not come."""
    if strategy.world_size > 1 and strategy.group.store is not None:
        module.register_forward_pre_hook(EvaluationTogether(
            strategy, "the tensor-parallel model", "tensor parallelism's forward exchanges activations within each "
            "TP group", prefix="tp-eval"), prepend=True)
