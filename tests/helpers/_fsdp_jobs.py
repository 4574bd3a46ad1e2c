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


def make_bn_model() -> nn.Sequential:
    """BatchNorm between the Linears: with sync_batchnorm, statistics over the global batch."""
    return nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 3))


MODELS = {"mlp": make_model, "bn": make_bn_model}


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
                   precision=case.get("precision", "32"), device=case.get("device", "auto"),
                   sync_batchnorm=case.get("sync_batchnorm", False))
    torch.manual_seed(0)
    build = MODELS[case.get("model", "mlp")]
    if case.get("meta"):
        with torch.device("meta"):
            model = build()
    else:
        model = build()
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


def initial_weights(device: str = "auto", **fsdp) -> dict | None:
    """The whole state right after ring.setup of a model built on the meta device (seed 0)."""
    ring = rt.Ring(strategy=FSDP(**fsdp), seed=0, device=device)
    with torch.device("meta"):
        model = make_model()
    model = ring.setup(model)
    out = ring.strategy.module_state(model)
    ring.close()
    return out


def four_rank_job(cases: dict[str, dict], loads: list[tuple[str, dict]]) -> dict | None:
    """4 ranks, one job: the cases, the loads, and the initial weights of a meta-built model."""
    fits = {name: fit(case) for name, case in cases.items()}
    loaded = load_cases(loads)
    initial = initial_weights()
    return {"fits": fits, "loads": loaded, "initial": initial} if fits[next(iter(fits))] is not None else None


def count_reduce_scatters() -> list[int]:
    """Reduce-scatter calls made by each backward, with accumulate=2 (FSDP2 calls dist.reduce_scatter_single)."""
    import torch.distributed as dist

    calls = [0]
    original = dist.reduce_scatter_single

    def counting(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    dist.reduce_scatter_single = counting
    try:
        ring = rt.Ring(strategy=FSDP(), seed=0, accumulate=2)
        model = make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = ring.setup(model, optimizer)
        per_backward = []
        for x, y in ring.loader(data(), batch_size=4, shuffle=True):
            before = calls[0]
            ring.backward(F.cross_entropy(model(x), y))
            per_backward.append(calls[0] - before)
            optimizer.step()
            optimizer.zero_grad()
        ring.close()
        return per_backward
    finally:
        dist.reduce_scatter_single = original


def _error(action) -> str:
    try:
        action()
    except rt.RingtrainError as e:
        return str(e)
    return "no error"


def refusals() -> dict:
    out = {}
    ring = rt.Ring(strategy=FSDP(), precision="bf16-mixed")
    out["twice"] = _error(lambda: ring.setup(ring.setup(make_model())))
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 10)).sum().backward()
    optimizer.step()
    out["stepped_optimizer"] = _error(lambda: ring.setup(model, optimizer))
    ring.close()
    ring = rt.Ring(strategy=FSDP(), precision="16-mixed")
    out["fp16"] = _error(lambda: ring.setup(make_model()))
    ring.close()
    return out


def ring_with(options: dict) -> None:
    rt.Ring(strategy=FSDP(**options))


def nonfinite_skip() -> dict:
    """nonfinite='skip' under FSDP: a NaN loss on rank 1 at its second batch drops that step on every rank."""
    ring = rt.Ring(strategy=FSDP(), seed=0, nonfinite="skip")
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = ring.setup(model, optimizer)
    for i, (x, y) in enumerate(ring.loader(data(32), batch_size=4)):
        loss = F.cross_entropy(model(x), y)
        if i == 1 and ring.rank == 1:
            loss = loss * float("nan")
        ring.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    whole = ring.strategy.module_state(model)
    out = {"steps": ring.optimizer_steps, "skipped": ring._step.skipped_steps,
           "finite": None if whole is None else all(torch.isfinite(v).all().item() for v in whole.values())}
    ring.close()
    return out


def evaluate_on_rank_zero_alone() -> str:
    """Rank 0 evaluates the sharded model alone under torch.no_grad while rank 1 goes on training: rank 0 is
    told why at once (the stall warning, 3 s here), rank 1 is stopped because rank 0 left."""
    ring = rt.Ring(strategy="fsdp", seed=0, stall_warning=3)
    model = make_model()
    model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = data()[:8]
    for step in range(3):
        if ring.rank == 0 and step == 1:
            with torch.no_grad():
                model(x)  # the evaluation alone  # ringtrain: ignore[eval-on-one-rank-through-ddp] (the trap under test)
        ring.backward(F.cross_entropy(model(x), y))
        opt.step()
        opt.zero_grad()
    return "trained"


def save_into(folder: str) -> str:
    """An FSDP save of a 1 MB model into ``folder`` (a tiny file system in the test): the error it gives."""
    ring = rt.Ring(strategy="fsdp", seed=0)
    model = nn.Sequential(nn.Linear(512, 512))
    model = ring.setup(model)
    try:
        ring.save(os.path.join(folder, "ckpt"), model=model)
        return ""
    except rt.RingtrainError as e:
        return str(e)
    finally:
        ring.close()


def unit_output_dtypes() -> dict:
    """bf16-mixed: the dtype an inner unit hands on and the one the whole model returns."""
    ring = rt.Ring(strategy=rt.strategies.FSDP(wrap=[nn.Linear]), precision="bf16-mixed", seed=0)
    model = ring.setup(nn.Sequential(nn.Linear(10, 16), nn.LayerNorm(16), nn.Linear(16, 3)))
    seen = {}
    model[0].register_forward_hook(lambda module, args, out: seen.__setitem__("unit", str(out.dtype)))
    seen["model"] = str(model(torch.randn(4, 10)).dtype)
    ring.close()
    return seen


def _state_of(path: str) -> list:
    """What is at ``path`` (and beside it): a file's bytes' digest and time, a folder's files with theirs."""
    import hashlib

    def one(p: str) -> tuple:
        with open(p, "rb") as f:
            return os.path.basename(p), hashlib.sha256(f.read()).hexdigest(), os.stat(p).st_mtime_ns
    if os.path.isdir(path):
        return sorted(one(os.path.join(path, name)) for name in os.listdir(path))
    return [one(path)] if os.path.exists(path) else []


def save_over(strategy: str, saves: list[tuple[str, bool | None]]) -> list[dict]:
    """Issue 33, item 1: ``ring.save(path, full=full)`` of a trained model for each of ``saves``, in order; per save
    its error ("" when saved), the ring collectives it cost, what is at ``path`` afterwards, and the folder's names."""
    ring = rt.Ring(strategy=strategy, seed=0)
    model = make_model()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for x, y in ring.loader(data(16), batch_size=4):
        ring.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    out = []
    for path, full in saves:
        before = ring.strategy.activity.calls
        try:
            ring.save(path, full=full, model=model, optimizer=optimizer)
            said = ""
        except rt.RingtrainError as e:
            said = str(e)
        out.append({"error": said, "collectives": ring.strategy.activity.calls - before, "state": _state_of(path),
                    "beside": sorted(os.listdir(os.path.dirname(path)))})
    ring.close()
    return out
