"""FSDP jobs run on real Gloo ranks by tests/strategies/test_fsdp.py (importable by spawned children).

Every case trains the same small MLP (its 3-row last layer does not divide evenly over 2 or
4 ranks: uneven shards) through ``rt.Ring``; ``fit`` returns the whole model and optimizer
state on rank 0 (None elsewhere), so a test compares it with one process trained on the
combined batch (``fit`` with the default single strategy).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import ringtrain as rt
from ringtrain.strategies import FSDP

N, STEPS_PER_EPOCH_AT = 64, None


def data(n: int = N) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 10, generator=g), torch.randint(0, 3, (n,), generator=g))


def make_model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1),
}


def strategy_of(case: dict):
    spec = case.get("strategy", "single")
    if spec == "fsdp":
        return FSDP(**case.get("fsdp", {}))
    return spec


def fit(case: dict) -> dict | None:
    """Train one case; rank 0 gets {"model", "optimizer", "norms", "local_numel", "units", ...}."""
    ring = rt.Ring(strategy=strategy_of(case), seed=0, accumulate=case.get("accumulate", 1),
                   precision=case.get("precision", "32"))
    torch.manual_seed(0)
    if case.get("meta"):
        with torch.device("meta"):
            model = make_model()
    else:
        model = make_model()
    optimizer = OPTIMIZERS[case.get("optimizer", "sgd")](model.parameters())
    model, optimizer = ring.setup(model, optimizer)
    loader = ring.loader(data(), batch_size=case["batch"], shuffle=True)
    norms = []
    for _ in ring.epochs(case.get("epochs", 1)):
        for x, y in loader:
            ring.backward(F.cross_entropy(model(x), y))
            if case.get("clip"):
                norm = ring.clip_grad_norm_(model, case["clip"])
                if norm is not None:
                    norms.append(float(norm))
            optimizer.step()
            optimizer.zero_grad()
    out = {
        "model": ring.strategy.module_state(model),
        "optimizer": ring.strategy.optimizer_state(optimizer, model),
        "norms": norms,
        "local_numel": sum(_local(p).numel() for p in model.parameters()),
        "units": list(getattr(ring.strategy, "units", [])),
        "mesh": ring.mesh.mesh_dim_names if ring.mesh is not None else None,
        "steps": ring.optimizer_steps,
    }
    if case.get("save"):
        ring.save(case["save"], model=model, optimizer=optimizer, epoch=7)
    if case.get("save_full"):
        ring.save(case["save_full"], full=True, model=model, optimizer=optimizer, epoch=7)
    ring.close()
    return out if ring.rank == 0 else None


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def fit_cases(cases: list[dict]) -> list[dict | None]:
    return [fit(case) for case in cases]


def load_into(path: str, case: dict) -> dict | None:
    """Set up ``case``'s strategy, load ``path`` into a fresh model and optimizer, return the whole state."""
    ring = rt.Ring(strategy=strategy_of(case), seed=5)
    torch.manual_seed(5)  # different weights than the saved ones: the load must replace all of them
    model = make_model()
    optimizer = OPTIMIZERS[case.get("optimizer", "sgd")](model.parameters())
    model, optimizer = ring.setup(model, optimizer)
    extra = ring.load(path, model=model, optimizer=optimizer)
    out = {"model": ring.strategy.module_state(model), "optimizer": ring.strategy.optimizer_state(optimizer, model),
           "extra": extra, "world": ring.world_size}
    ring.close()
    return out if ring.rank == 0 else None


def load_cases(items: list[tuple[str, dict]]) -> list[dict | None]:
    return [load_into(path, case) for path, case in items]


def saved_files(path: str) -> list[str]:
    return sorted(os.listdir(path))
