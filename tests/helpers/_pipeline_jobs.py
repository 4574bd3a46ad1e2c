"""Pipeline jobs run on real Gloo ranks by tests/strategies/test_pipeline.py (importable by spawned children).

Every case trains the same small Sequential MLP with SGD + momentum on fixed
batches; ``reference`` trains the unsplit model in one process on the same
(combined) batches, for the equivalence checks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ringtrain.parallel import environments
from ringtrain.errors import RingtrainError
from ringtrain.loop.precision import Precision
from ringtrain.parallel.stages import split
from ringtrain.strategies import Pipeline, StageData

LR, MOMENTUM = 0.1, 0.9


class KeptWhole(StageData):
    """A data strategy of the test's own (issue 29, item 6): each replica keeps its stage whole, unwrapped, and
    says what the pipeline asked of it — the pipeline composes through the StageData contract alone."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def dims_over(self, replicas: int) -> tuple[tuple[str, int], ...]:
        self.asked.append(f"dims_over({replicas})")
        return (("dp_replicate", replicas),)

    def place_stage(self, stage, *, mesh, device, precision, meta, broadcast) -> None:
        self.asked.append("place_stage")
        stage.to(device)

    def run_stage(self, stage, *, mesh, device):
        self.asked.append("run_stage")
        return stage


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 3))


def make_bn_model() -> nn.Sequential:
    """BatchNorm in every stage: running statistics must come out as in one process with micro-batches."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 16), nn.BatchNorm1d(16),
                         nn.Tanh(), nn.Linear(16, 3))


MODELS = {"mlp": make_model, "bn": make_bn_model}


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The combined batch of ``step`` (all replicas together)."""
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(size, 10, generator=g), torch.randint(0, 3, (size,), generator=g)


def _size(size: int | list[int], step: int) -> int:
    return size[step] if isinstance(size, list) else size


def reference(steps: int, size: int | list[int], *, accumulate: int = 1, clip: float | None = None, start: int = 0,
              state: dict | None = None, optim_state: dict | None = None, model: str = "mlp",
              microbatches: int | None = None) -> dict:
    """Single-process training of the unsplit model: optimizer step i sees batches i*k .. i*k+k-1
    (``size``: the batch size, or one per optimizer step). ``microbatches``: run the model through
    ``ringtrain.parallel.stages`` with that many micro-batches (what BatchNorm sees in a pipeline)."""
    model = MODELS[model]()
    if microbatches is not None:
        model = split(model, devices=["cpu"], microbatches=microbatches)
    optimizer = make_optimizer(model)
    if state is not None:
        model.load_state_dict(state)
    if optim_state is not None:
        optimizer.load_state_dict(optim_state)
    losses = []
    for step in range(start, steps):
        for k in range(accumulate):
            x, y = batch(step * accumulate + k, _size(size, step))
            loss = F.cross_entropy(model(x), y)
            (loss / accumulate).backward()
            losses.append(loss.item())
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()
    return {"state": model.state_dict(), "optimizer": optimizer.state_dict(), "losses": losses}


def _strategy(**kwargs) -> Pipeline:
    strategy = Pipeline(**kwargs).attach(environments.detect(), device="cpu")
    strategy.setup_environment()
    return strategy


def _train(strategy: Pipeline, *, split_at, steps: int, per_replica: int | list[int], accumulate: int = 1,
           clip: float | None = None, precision: str = "32", start: int = 0, load: str | None = None,
           model: str = "mlp") -> dict:
    model = MODELS[model]()
    optimizer = make_optimizer(model)
    prec = Precision(precision, strategy.device)
    scaler = prec.scaler  # enabled for 16-mixed only (what Ring's optimizer wrapper drives)
    stage = strategy.wrap_module(model, split_at=list(split_at), precision=prec)
    strategy.setup_optimizer(optimizer)
    if load is not None:
        ckpt = torch.load(load, weights_only=True)
        strategy.load_full_state_dict(ckpt["model"])
        strategy.load_full_optimizer_state_dict(optimizer, ckpt["optimizer"])
    replicas, replica = strategy.data_parallel_size, strategy.data_parallel_rank
    losses, raw, norms = [], [], []
    for step in range(start, steps):
        for k in range(accumulate):
            size = _size(per_replica, step)
            x, y = batch(step * accumulate + k, size * replicas)
            rows = slice(replica * size, (replica + 1) * size)  # the loader's shard of this replica
            loss = strategy.pipeline_step(x[rows], y[rows], F.cross_entropy, divisor=accumulate,
                                          sync=k == accumulate - 1, scaler=scaler)
            raw.append(loss.item())  # this replica's loss, on every rank of it
            losses.append(strategy.all_reduce(loss, "mean").item())  # mean over replicas = combined batch's loss
        if scaler.is_enabled():
            scaler.unscale_(optimizer)
        if clip is not None:
            norms.append(strategy.clip_grad_norm_(None, clip).item())
        if scaler.is_enabled():
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad()
    return {
        "scale": scaler.get_scale() if scaler.is_enabled() else None,
        "state": strategy.full_state_dict(),
        "optimizer": strategy.full_optimizer_state_dict(optimizer),
        "losses": losses,
        "raw_losses": raw,
        "norms": norms,
        "stage": strategy.stage_index,
        "replica": replica,
        "local_keys": list(strategy.local_state(None)),
        "local_params": sum((p.to_local() if hasattr(p, "to_local") else p).numel()
                            for p in strategy.named_parameters(None).values()),
        "mesh": strategy.mesh.mesh_dim_names,
        "asked": sorted(set(getattr(strategy.data, "asked", []))),
        "model_meta": all(p.device.type == "meta" for n, p in model.named_parameters()
                          if n not in strategy.local_state(None)),
    }


def train_cases(cases: list[dict], bad_batch: int | None = None) -> list:
    """Several trainings in one process group (each case: Pipeline kwargs + _train kwargs).

    ``bad_batch``: finally step a batch of that size (not a multiple of microbatches) and append the error.
    """
    results: list = []
    owner = None
    for case in cases:
        case = dict(case)
        train_kwargs = {k: case.pop(k) for k in list(case) if k in ("split_at", "steps", "per_replica", "accumulate", "clip", "precision", "start", "load", "model")}
        strategy = _strategy(**case)
        owner = owner or strategy
        results.append(_train(strategy, **train_kwargs))
    if bad_batch is not None:
        x, y = batch(0, bad_batch)
        try:
            strategy.pipeline_step(x, y, F.cross_entropy)
            results.append("")
        except RingtrainError as e:
            results.append(str(e))
    # fp16: an overflow in the last stage only must make every stage's GradScaler skip the step
    # (checked on the first case's strategy: fp16 runs with replicated stages only).
    if owner.shards_state:
        results.append(None)
        owner.barrier()
        owner.teardown()
        return results
    for p in owner._local[0].parameters():
        p.grad = torch.ones_like(p)
    if owner.is_last_stage:
        next(owner._local[0].parameters()).grad[0] = float("inf")
    owner._agree_on_overflow()
    results.append(not all(torch.isfinite(p.grad).all() for p in owner._local[0].parameters()))
    owner.barrier()
    owner.teardown()
    return results


def save_then_resume(path: str, steps: int, save_at: int, per_replica: int, resumes: list[dict]) -> dict:
    """Train 2 stages x 1 replica to ``save_at`` and save a full checkpoint; then resume it in each of
    ``resumes`` (Pipeline kwargs + split_at + per_replica, same combined batch) and go on to ``steps``."""
    first = _strategy(stages=2, microbatches=4, schedule="1f1b")
    saved = _train(first, split_at=["2"], steps=save_at, per_replica=per_replica)
    if first.rank == 0:
        torch.save({"model": saved["state"], "optimizer": saved["optimizer"]}, path)
    first.barrier()
    resumed = []
    for resume in resumes:
        resume = dict(resume)
        split_at, size = resume.pop("split_at"), resume.pop("per_replica")
        again = _strategy(**resume)
        resumed.append(_train(again, split_at=split_at, steps=steps, per_replica=size, start=save_at, load=path))
    first.barrier()
    first.teardown()
    return {"saved": saved, "resumed": resumed}


def shape_change() -> None:
    """Stage 0's output length depends on the data: the pipeline must stop with a clear error."""

    class KeepPositive(nn.Module):
        def forward(self, x):
            return x[x[:, 0] > 0]  # a data-dependent number of rows

    strategy = _strategy(stages=2, microbatches=4, schedule="gpipe")
    model = nn.Sequential(nn.Linear(10, 4), KeepPositive(), nn.Linear(4, 3))
    strategy.wrap_module(model, split_at=["2"])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 10, generator=g)
    strategy.pipeline_step(x, torch.zeros(64, dtype=torch.long), lambda out, y: out.sum())
    strategy.teardown()


def ring_save_or_load(path: str, data: str, stages: int, save: bool) -> tuple | None:
    """Through rt.Ring: one step then a sharded save (``save``), or a load; rank 0 gets the whole state."""
    import ringtrain as rt

    ring = rt.Ring(strategy=Pipeline(stages=stages, microbatches=2, schedule="gpipe", data=data), seed=0)
    model = make_model()
    optimizer = make_optimizer(model)
    model, optimizer = ring.setup(model, optimizer, split_at=["2"] if stages == 2 else [])
    extra = None
    if save:
        replicas, replica = ring.strategy.data_parallel_size, ring.strategy.data_parallel_rank
        x, y = batch(0, 8 * replicas)
        ring.pipeline_step(x[replica * 8:(replica + 1) * 8], y[replica * 8:(replica + 1) * 8], F.cross_entropy)
        optimizer.step()
        optimizer.zero_grad()
        ring.save(path, full=False, model=model, optimizer=optimizer, epoch=3)
    else:
        extra = ring.load(path, model=model, optimizer=optimizer)
    whole = (ring.strategy.module_state(model), ring.strategy.optimizer_state(optimizer, model), extra)
    ring.close()
    return whole if ring.rank == 0 else None


def global_batch_line(stages: int) -> str:
    """What the first training loader of a pipeline's ring prints (rank 0; "" elsewhere)."""
    import contextlib
    import io

    import ringtrain as rt

    ring = rt.Ring(strategy=Pipeline(stages=stages, microbatches=2, schedule="gpipe"), seed=0)
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        ring.loader(torch.utils.data.TensorDataset(torch.randn(64, 16)), batch_size=8)
    ring.close()
    return said.getvalue()
