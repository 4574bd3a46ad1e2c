"""Activation-checkpointing and compile jobs run on real Gloo ranks by tests/strategies/test_checkpointing.py and
test_compiling.py (importable by spawned children).

Every case trains _tp_jobs' tiny transformer (an embedding, 2 blocks of attention and MLP with LayerNorms, a head)
with SGD through ``rt.Ring(activation_checkpointing=..., compile=...)``; rank 0 gets the whole model, the losses,
the keys ``ring.save`` wrote and, where ``record`` is set, what each block was when ``nn.Module.compile`` was called
on it (compile itself replaced by a recorder: the order, not the compiler, is under test).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import _tp_jobs as tp_jobs
import ringtrain as rt
from ringtrain.strategies import DDP, FSDP, TP
from ringtrain.strategies.checkpointing import mode_of


def strategy_of(case: dict) -> Any:
    kind, tp = case.get("strategy", "single"), case.get("tp")
    if kind == "tp":
        return TP(tp)
    if kind == "ddp":
        return DDP(tp=tp)
    if kind == "fsdp":
        return FSDP(tp=tp, **case.get("fsdp", {}))
    return kind


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor"


def recording_compile(seen: list[dict]):
    """``nn.Module.compile`` that notes what the block is when it is called, and compiles nothing."""
    def compile(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        from torch.distributed.fsdp import FSDPModule

        seen.append({"class": type(self).__name__, "checkpointing": mode_of(self),
                     "tensor_parallel": all(_is_dtensor(p) for p in self.parameters()),
                     "sharded": isinstance(self, FSDPModule), "options": kwargs})
        self._compiled_call_impl = None  # nothing compiled: the eager forward runs
    return compile


def fit(case: dict) -> dict | None:
    seen: list[dict] = []
    original = nn.Module.compile
    if case.get("record"):
        nn.Module.compile = recording_compile(seen)
    try:
        ring = rt.Ring(strategy=strategy_of(case), seed=0, activation_checkpointing=case.get("ac"),
                       compile=case.get("compile", False))
        torch.manual_seed(0)
        model = tp_jobs.Tiny()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model, optimizer = ring.setup(model, optimizer)
    except rt.RingtrainError as e:
        if not case.get("refused"):
            raise
        ring.close()
        return {"refused": str(e)} if ring.rank == 0 else None
    finally:
        nn.Module.compile = original
    losses = []
    for _ in ring.epochs(1):
        for x, y in ring.loader(tp_jobs.data(), batch_size=case.get("batch", 8), shuffle=True):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            ring.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(ring.all_reduce(loss.detach(), "mean")))
    plain = ring.unwrap(model)
    out = {"losses": losses, "model": ring.strategy.module_state(model), "seen": seen,
           "modes": [mode_of(b) for b in plain.blocks], "sharded_after": [type(b).__name__ for b in plain.blocks],
           "names": [n for n, _ in plain.named_parameters()], "applied": ring.strategy.blocks.applied}
    if case.get("save"):
        ring.save(case["save"], full=True, model=model, optimizer=optimizer)
        ring.save(case["save"] + ".folder", full=False, model=model, optimizer=optimizer)
    ring.close()
    if case.get("save") and ring.rank == 0:
        out["file_keys"] = sorted(torch.load(case["save"], weights_only=True)["model"])
        from torch.distributed.checkpoint import FileSystemReader

        out["folder_keys"] = sorted(FileSystemReader(case["save"] + ".folder").read_metadata().state_dict_metadata)
    return out if ring.rank == 0 else None


def pipeline_fit(ac: str | None, steps: int = 3) -> dict | None:
    """_pipeline_jobs' MLP (an nn.Sequential of Linears: those are its blocks) in 2 stages, through rt.Ring."""
    import _pipeline_jobs as pipeline_jobs
    from ringtrain.strategies import Pipeline

    ring = rt.Ring(strategy=Pipeline(stages=2, microbatches=2, schedule="gpipe"), seed=0, activation_checkpointing=ac)
    model = pipeline_jobs.make_model()
    optimizer = pipeline_jobs.make_optimizer(model)
    model, optimizer = ring.setup(model, optimizer, split_at=["2"])
    losses = []
    for step in range(steps):
        losses.append(float(ring.pipeline_step(*pipeline_jobs.batch(step, 8), F.cross_entropy)))
        optimizer.step()
        optimizer.zero_grad()
    out = {"losses": losses, "model": ring.strategy.module_state(model),
           "modes": [mode_of(m) for m in ring.unwrap(model).modules()]}
    ring.close()
    return out if ring.rank == 0 else None


def job(fits: dict[str, dict]) -> dict | None:
    out = {name: pipeline_fit(case["ac"]) if case.get("strategy") == "pipeline" else fit(case)
           for name, case in fits.items()}
    return out if int(os.environ.get("RANK", "0")) == 0 else None


_POOLS: list = []


def leaves_a_thread_pool() -> int:
    """A job that leaves a ThreadPoolExecutor with idle workers, as torch.compile leaves its compile pool."""
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(2)
    _POOLS.append(pool)
    return pool.submit(lambda: 7).result()
