"""Functions run inside real multi-process jobs by the tests (importable by spawned children)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import ringtrain as rt


def regression_data(n: int = 96, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    return TensorDataset(x, torch.randint(0, 3, (n,), generator=g))


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().cpu().flatten() for p in model.parameters()])


def train(
    batch_size: int,
    epochs: int = 2,
    *,
    n: int = 96,
    save: str | None = None,
    save_after_batches: int | None = None,
    load: str | None = None,
    count_allreduce: bool = False,
    setup_kwargs: dict | None = None,
    clip: float | None = None,
    **ring_kwargs,
):
    """SGD with momentum on a small MLP; returns the final parameters.

    ``ring_kwargs`` go to ``rt.Ring`` (accumulate, precision, strategy, init_method...).
    ``save_after_batches``: stop the run after that many batches of the last
    epoch, saving a checkpoint first (a run interrupted mid-epoch).
    ``count_allreduce``: return ``(params, all-reduce calls made by each backward)``,
    counted by a DDP communication hook (one call per gradient bucket).
    """
    ring = rt.Ring(seed=0, **ring_kwargs)
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = ring.setup(model, optimizer, **(setup_kwargs or {}))
    calls, per_backward = [], []
    if count_allreduce:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def counting_hook(state, bucket):
            calls.append(bucket.index())
            return allreduce_hook(state, bucket)

        model.register_comm_hook(None, counting_hook)
    loader = ring.loader(regression_data(n), batch_size=batch_size, shuffle=True)
    if load:
        ring.load(load, model=model, optimizer=optimizer)
    for epoch in ring.epochs(epochs):
        for i, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y)
            before = len(calls)
            ring.backward(loss)
            per_backward.append(len(calls) - before)
            if clip is not None:
                ring.clip_grad_norm_(model, clip)
            optimizer.step()
            optimizer.zero_grad()
            if save_after_batches is not None and epoch == epochs - 1 and i + 1 == save_after_batches:
                ring.save(save, model=model, optimizer=optimizer)
                ring.close()
                return flat_params(model)
        if save and save_after_batches is None:
            ring.save(save, model=model, optimizer=optimizer, epoch=epoch)
    ring.close()
    if count_allreduce:
        return flat_params(model), per_backward
    return flat_params(model)


def collectives() -> dict:
    ring = rt.Ring()
    r = ring.rank
    out = {
        "sum": ring.all_reduce(torch.tensor([r + 1.0, 2.0]), op="sum"),
        "mean": ring.all_reduce(torch.tensor(float(r)), op="mean"),
        "mean_int": ring.all_reduce(torch.tensor(r + 1), op="mean"),
        "max": ring.all_reduce(torch.tensor([r, -r]), op="max"),
        "min": ring.all_reduce(torch.tensor([r, -r]), op="min"),
        # rank r contributes r+1 rows of value r: uneven first dimensions
        "gather": ring.all_gather(torch.full((r + 1, 2), float(r))),
        "gather_scalar": ring.all_gather(torch.tensor(r * 10)),
        "objects": ring.gather_object({"rank": r, "name": f"r{r}"}),
        "broadcast": ring.broadcast(torch.tensor([float(r) + 5.0]), src=1),
        "broadcast_object": ring.broadcast_object(f"from {r}", src=0),
        # seed 002's logging helpers: dist.reduce / dist.gather to one rank
        "reduce_sum_to_1": ring.reduce(torch.tensor([r + 1.0]), dst=1, op="sum"),
        "reduce_mean_int": ring.reduce(torch.tensor(r + 1)),
        "product": ring.all_reduce(torch.tensor([r + 2.0, 3.0]), op="product"),
        "gather_to_0": ring.gather(torch.full((r + 1, 2), float(r)), dst=0),
    }
    ring.barrier()
    ring.close()
    return out


def shards(n: int, shuffle: bool, exact: bool, epochs: int, use_ring_epochs: bool = True, batch_size: int = 4):
    """Indices each rank saw per epoch, from a dataset whose samples are their own indices."""
    ring = rt.Ring(seed=3)
    loader = ring.loader(TensorDataset(torch.arange(n)), batch_size=batch_size, shuffle=shuffle, exact=exact)
    seen = []
    if use_ring_epochs:
        for _ in ring.epochs(epochs):
            seen.append(torch.cat([x for (x,) in loader]).tolist())
    else:
        for _ in range(epochs):
            seen.append(torch.cat([x for (x,) in loader]).tolist())
    ring.close()
    return seen


def exact_eval(n: int) -> list:
    """Per-sample outputs of an exact loader, gathered back: should be dataset order, no duplicates."""
    ring = rt.Ring()
    loader = ring.loader(TensorDataset(torch.arange(n)), batch_size=3, exact=True)
    outputs = torch.cat([x * 2 for (x,) in loader]) if len(loader) else torch.empty(0, dtype=torch.long)
    gathered = ring.all_gather(outputs)
    ring.close()
    return gathered.tolist()


def ring_error(**kwargs) -> str:
    """Build a Ring with ``kwargs`` and return the error message it raises ('' if none)."""
    try:
        rt.Ring(**kwargs).close()
    except rt.RingtrainError as e:
        return str(e)
    return ""


def loader_error(n: int, batch_size: int) -> str:
    ring = rt.Ring()
    try:
        ring.loader(TensorDataset(torch.arange(n)), batch_size=batch_size)
    except rt.RingtrainError as e:
        return str(e)
    finally:
        ring.close()
    return ""


def save_failure(path: str) -> str:
    """ring.save to an impossible path: every rank must raise, none may hang."""
    ring = rt.Ring()
    model = ring.setup(small_model())
    try:
        ring.save(path, model=model)
    except rt.RingtrainError as e:
        return str(e)
    finally:
        ring.close()
    return ""


def print_and_progress(n: int) -> int:
    ring = rt.Ring()
    ring.print(f"hello from rank {ring.rank}")
    loader = ring.loader(TensorDataset(torch.arange(n).float()), batch_size=2)
    count = sum(1 for _ in ring.progress(loader, desc="p"))
    ring.close()
    return count


def ddp_options() -> tuple:
    ring = rt.Ring()
    model = ring.setup(small_model(), find_unused_parameters=True, gradient_as_bucket_view=True)
    out = (model.find_unused_parameters, model.gradient_as_bucket_view)
    ring.close()
    return out


def seeded_streams() -> tuple:
    """Random draws before and after setup: equal across ranks before, distinct after."""
    ring = rt.Ring(seed=7)
    before = torch.rand(3)
    ring.setup(small_model())
    after = torch.rand(3)
    ring.close()
    return before, after


def different_model_on_rank_one() -> str:
    ring = rt.Ring()
    model = small_model() if ring.rank == 0 else nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 4))
    try:
        ring.setup(model)
    except rt.RingtrainError as e:
        return str(e)
    finally:
        ring.close()
    return ""


def nan_on_rank(bad_rank: int, nonfinite: str, steps: int = 4) -> tuple:
    """Train a few steps where ``bad_rank`` gets a NaN loss at step 2; return (params, steps, skipped) or the error."""
    ring = rt.Ring(seed=0, nonfinite=nonfinite)
    model = small_model()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = regression_data(8).tensors
    try:
        for step in range(steps):
            loss = F.cross_entropy(model(x), y)
            if step == 2 and ring.rank == bad_rank:
                loss = loss * float("nan")
            ring.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    except rt.RingtrainError as e:
        return ("error", str(e))
    finally:
        ring.close()
    return flat_params(model), ring.optimizer_steps, ring._step.skipped_steps


def whole_params(ring: rt.Ring, model: nn.Module) -> torch.Tensor | None:
    """The model's parameters, flattened, as one process holds them (collective under FSDP); None off rank 0
    when sharded."""
    whole = ring.strategy.module_state(model)
    return None if whole is None else torch.cat([v.flatten() for v in whole.values()])


def periodic(folder: str, epochs: int, stop_at_step: int | None = None, save_every: int = 2,
             strategy: str = "auto", lr: float = 0.1, resume: str = "auto", batch_size: int = 4) -> tuple:
    """Train with checkpoint_dir/save_every; stop (as if killed) right after ``stop_at_step``.

    Returns (params, every sample index seen, in order, as (epoch, index) pairs).
    """
    ring = rt.Ring(strategy=strategy, seed=0, checkpoint_dir=folder, save_every=save_every, keep_last=2, resume=resume)
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model, optimizer = ring.setup(model, optimizer)
    n = 40
    data = TensorDataset(regression_data(n).tensors[0], regression_data(n).tensors[1], torch.arange(n))
    loader = ring.loader(data, batch_size=batch_size, shuffle=True)
    seen = []
    for epoch in ring.epochs(epochs):
        for x, y, idx in loader:
            seen += [(epoch, int(i)) for i in idx]
            ring.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            if stop_at_step is not None and ring.optimizer_steps == stop_at_step:
                params = whole_params(ring, model)
                ring.close()
                return params, seen
    params = whole_params(ring, model)
    ring.close()
    return params, seen


def periodic_slow_commit(folder: str, epochs: int, stop_at_step: int, strategy: str = "fsdp", delay: float = 5.0):
    """``periodic``, with rank 0's end of each sharded save (its metadata and the manifest, after the ranks'
    collective part) taking ``delay`` seconds: rank 1 finishes while rank 0 still writes alone."""
    import time

    from ringtrain.checkpoint import sharded

    real = sharded.finish

    def slow(*args, **kwargs):
        time.sleep(delay)
        return real(*args, **kwargs)

    sharded.finish = slow
    try:
        return periodic(folder, epochs, stop_at_step, save_every=3, strategy=strategy)
    finally:
        sharded.finish = real


def periodic_refused(folder: str, epochs: int, **kwargs) -> str:
    """``periodic``, expected to be refused: the error's text ('' when it was not)."""
    try:
        periodic(folder, epochs, **kwargs)
    except rt.RingtrainError as e:
        return str(e)
    return ""


def misbehave(mode: str) -> tuple:
    """Under debug_collectives: rank 1 calls the wrong thing (or nothing); return (error, seconds)."""
    import time

    ring = rt.Ring(debug_collectives=4)
    start = time.monotonic()
    try:
        ring.all_reduce(torch.ones(2), op="sum")  # a good round first
        if mode == "skip":
            if ring.rank == 0:
                ring.all_reduce(torch.ones(3), op="sum")
            ring.barrier()
        elif mode == "shape":
            ring.all_reduce(torch.ones(3 + ring.rank), op="sum")
        elif mode == "absent":
            if ring.rank == 1:
                time.sleep(8)
                return ("slept", 0.0)
            ring.barrier()
    except rt.RingtrainError as e:
        return (str(e), time.monotonic() - start)
    finally:
        ring.close()
    return ("", time.monotonic() - start)


class Stream(torch.utils.data.IterableDataset):
    """0..n-1 as a stream (no __len__), the same order every pass."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def stream_shares(n: int, workers: int, resume_after: int = 0) -> list:
    """What this rank's ring loader hands out of a stream, per epoch (two epochs); ``resume_after``: a second
    loader resumed after that many batches of epoch 0 (a restart) gives the rest."""
    ring = rt.Ring()
    loader = ring.loader(Stream(n), batch_size=2, num_workers=workers)
    seen = [[int(v) for batch in loader for v in batch] for _ in range(2)]
    if resume_after:
        again = ring.loader(Stream(n), batch_size=2, num_workers=workers)
        again.resume(0, resume_after)
        seen.append([int(v) for batch in again for v in batch])
    ring.close()
    return seen


class WithBuffer(nn.Module):
    """A model with a buffer: DDP broadcasts it in every forward that syncs."""

    def __init__(self) -> None:
        super().__init__()
        self.net = small_model()
        self.register_buffer("scale", torch.ones(1))

    def forward(self, x):
        return self.net(x) * self.scale


def eval_on_rank_zero_only(evaluate: bool) -> torch.Tensor:
    """DDP training where rank 0 alone evaluates through the wrapped model under torch.no_grad every other step
    (nanoGPT's estimate_loss under `if master_process`): no collective there, nothing falls out of step."""
    ring = rt.Ring(strategy="ddp", seed=0)
    torch.manual_seed(0)
    model = WithBuffer()
    model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.05))
    data = regression_data()
    for step, (x, y) in enumerate(ring.loader(data, batch_size=4)):
        if evaluate and ring.rank == 0 and step % 2 == 0:
            with torch.no_grad():
                model.eval()
                model(x)
                model.train()
        ring.backward(F.cross_entropy(model(x), y))
        opt.step()
        opt.zero_grad()
    if evaluate and ring.rank == 0:  # once more after the last step, while rank 1 goes on to gather the weights
        with torch.no_grad():
            model(x)
    params = whole_params(ring, model)
    ring.close()
    return params
