"""Collective jobs run inside real multi-process groups (importable by spawned children).

Each job runs many cases in one launch (process start dominates on small machines)
and returns raw results; the tests compare them with ``_hvd_expected``.
"""

from __future__ import annotations

import time

import torch

import ringtrain.horovod as hvd
from _hvd_expected import DTYPES, OPS, a2a_splits, value

SHAPE = (3, 4)


def _op(name: str):
    return getattr(hvd, name)


ALL_MODES = ("sync", "async", "inplace", "async_inplace")


def collective_matrix(modes=ALL_MODES) -> dict:
    """Every collective x every dtype x sync/async/in-place; keys describe the case."""
    hvd.init()
    out = _matrix(modes)
    hvd.shutdown()
    return out


def _matrix(modes) -> dict:
    r, n = hvd.rank(), hvd.size()
    out: dict = {}
    for dtype in DTYPES:
        d = str(dtype)
        for op in OPS:
            if op == "Average" and dtype == torch.bool:
                continue
            for mode in modes:
                x = value(r, dtype, SHAPE, f"ar{op}")
                if mode == "sync":
                    got = hvd.allreduce(x, op=_op(op))
                elif mode == "async":
                    got = hvd.synchronize(hvd.allreduce_async(x, op=_op(op)))
                elif mode == "inplace":
                    hvd.allreduce_(x, op=_op(op))
                    got = x
                else:
                    handle = hvd.allreduce_async_(x, op=_op(op))
                    while not hvd.poll(handle):
                        time.sleep(0.001)
                    hvd.synchronize(handle)
                    got = x
                out[("allreduce", d, op, mode)] = got
        rows = r + 1
        x = value(r, dtype, (rows, 2), "ag")
        out[("allgather", d, "sync")] = hvd.allgather(x)
        out[("allgather", d, "async")] = hvd.synchronize(hvd.allgather_async(x))
        for root in range(n):
            x = value(r, dtype, SHAPE, f"bc{root}")
            out[("broadcast", d, root, "sync")] = hvd.broadcast(x, root)
            out[("broadcast", d, root, "async")] = hvd.synchronize(hvd.broadcast_async(x, root))
            y = x.clone()
            hvd.broadcast_(y, root)
            out[("broadcast", d, root, "inplace")] = y
            z = x.clone()
            hvd.synchronize(hvd.broadcast_async_(z, root))
            out[("broadcast", d, root, "async_inplace")] = z
        splits = a2a_splits(r, n)
        x = value(r, dtype, (sum(splits), 2), "a2a")
        got, received = hvd.alltoall(x, splits=splits)
        out[("alltoall", d, "splits")] = (got, received)
        out[("alltoall", d, "async")] = hvd.synchronize(hvd.alltoall_async(x, splits=torch.tensor(splits, dtype=torch.int32)))
        x = value(r, dtype, (2 * n, 3), "a2a-even")
        out[("alltoall", d, "even")] = hvd.alltoall(x)
        for op in ("Sum", "Average", "Min", "Max"):
            if op == "Average" and dtype == torch.bool:
                continue
            x = value(r, dtype, (2 * n + 1, 2), f"rs{op}")
            out[("reducescatter", d, op, "sync")] = hvd.reducescatter(x, op=_op(op))
            out[("reducescatter", d, op, "async")] = hvd.synchronize(hvd.reducescatter_async(x, op=_op(op)))
    # grouped forms: mixed dtypes in one call
    xs = [value(r, dt, (2, 3), "grouped") for dt in (torch.float32, torch.int16, torch.float32, torch.int64)]
    out[("grouped_allreduce", "sync")] = hvd.grouped_allreduce(xs, op=hvd.Sum)
    out[("grouped_allreduce", "async")] = hvd.synchronize(hvd.grouped_allreduce_async(xs, op=hvd.Sum))
    ys = [x.clone() for x in xs]
    hvd.grouped_allreduce_(ys, op=hvd.Sum)
    out[("grouped_allreduce", "inplace")] = ys
    out[("grouped_allgather", "sync")] = hvd.grouped_allgather([value(r, torch.float32, (r + 1, 2), "gag"),
                                                                value(r, torch.int16, (r + 2,), "gag")])
    out[("grouped_reducescatter", "sync")] = hvd.grouped_reducescatter(
        [value(r, torch.float32, (2 * n + 1, 2), "grs"), value(r, torch.int64, (n, 1), "grs")], op=hvd.Sum)
    # scale factors, int16 wrap-around, non-contiguous in-place, 0-d tensors
    out[("scaled", "float")] = hvd.allreduce(value(r, torch.float32, SHAPE, "sc"), op=hvd.Sum,
                                             prescale_factor=0.5, postscale_factor=4.0)
    out[("scaled", "int")] = hvd.allreduce(value(r, torch.int32, SHAPE, "sc"), op=hvd.Sum, prescale_factor=2.0,
                                           postscale_factor=0.5)
    out[("wrap", "int16")] = hvd.allreduce(torch.tensor([30000, -30000], dtype=torch.int16), op=hvd.Sum)
    t = value(r, torch.float32, (4, 3), "nc").t()
    hvd.allreduce_(t, op=hvd.Sum)
    out[("noncontiguous", "allreduce_")] = t
    out[("scalar", "allreduce")] = hvd.allreduce(torch.tensor(float(r + 1)), op=hvd.Sum)
    out[("deprecated", "average")] = hvd.allreduce(value(r, torch.float32, SHAPE, "dep"), average=False)
    hvd.barrier()
    return out


def autograd_cases() -> dict:
    """Gradients through the differentiable collectives (Horovod's rules), with rank-dependent upstream grads."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    w = lambda shape, salt: value(r, torch.float64, shape, "w" + salt)  # noqa: E731
    out = {}
    for op in ("Sum", "Average"):
        x = value(r, torch.float64, SHAPE, "x").requires_grad_()
        (hvd.allreduce(x, op=_op(op), prescale_factor=2.0, postscale_factor=0.5) * w(SHAPE, "ar")).sum().backward()
        out[("allreduce", op)] = x.grad
    xs = [value(r, torch.float64, (2,), f"g{i}").requires_grad_() for i in range(2)]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
    sum((y * w((2,), f"g{i}")).sum() for i, y in enumerate(ys)).backward()
    out[("grouped_allreduce", "Sum")] = [x.grad for x in xs]
    x = value(r, torch.float64, (r + 1, 2), "x").requires_grad_()
    total = n * (n + 1) // 2
    (hvd.allgather(x) * w((total, 2), "ag")).sum().backward()
    out[("allgather",)] = x.grad
    x = value(r, torch.float64, SHAPE, "x").requires_grad_()
    (hvd.broadcast(x, n - 1) * w(SHAPE, "bc")).sum().backward()
    out[("broadcast",)] = x.grad
    splits = a2a_splits(r, n)
    x = value(r, torch.float64, (sum(splits), 2), "x").requires_grad_()
    y, received = hvd.alltoall(x, splits=splits)
    (y * w((int(received.sum()), 2), "a2a")).sum().backward()
    out[("alltoall",)] = x.grad
    for op in ("Sum", "Average"):
        x = value(r, torch.float64, (2 * n + 1, 2), "x").requires_grad_()
        y = hvd.reducescatter(x, op=_op(op))
        (y * w(tuple(y.shape), "rs")).sum().backward()
        out[("reducescatter", op)] = x.grad
    x = value(r, torch.float32, SHAPE, "x").requires_grad_()
    (hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16) * 2).sum().backward()
    out[("allreduce", "fp16")] = x.grad
    hvd.shutdown()
    return out


def mismatches() -> dict:
    """Mismatched collectives: each must raise on every rank, quickly, leaving the group usable."""
    hvd.init()
    r = hvd.rank()
    cases = {
        "shape": lambda: hvd.allreduce(torch.ones(3 + r)),
        "dtype": lambda: hvd.allreduce(torch.ones(3, dtype=torch.float32 if r == 0 else torch.float64)),
        "op": lambda: hvd.allreduce(torch.ones(3), op=hvd.Sum if r == 0 else hvd.Max),
        "root": lambda: hvd.broadcast(torch.ones(3), root_rank=r),
        "kind": lambda: hvd.allreduce(torch.ones(3)) if r == 0 else hvd.broadcast(torch.ones(3), 0),
        "allgather_rest": lambda: hvd.allgather(torch.ones(2, 3 + r)),
        "reducescatter_shape": lambda: hvd.reducescatter(torch.ones(4 + r, 2)),
        "bad_root": lambda: hvd.broadcast(torch.ones(3), root_rank=7 if r == 1 else 0),
        "bad_splits": lambda: hvd.alltoall(torch.ones(4), splits=[1, 3] if r == 0 else [3, 3]),
        "scale": lambda: hvd.allreduce(torch.ones(3), prescale_factor=1.0 + r),
        "grouped_layout": lambda: hvd.grouped_allreduce([torch.ones(2), torch.ones(3 + r)]),
    }
    out = {}
    for name, call in cases.items():
        start = time.perf_counter()
        try:
            call()
            out[name] = ("no error", time.perf_counter() - start)
        except hvd.HorovodInternalError as e:
            out[name] = ("engine: " + str(e), time.perf_counter() - start)
        except Exception as e:  # noqa: BLE001 - the test inspects type and message
            out[name] = (f"{type(e).__name__}: {e}", time.perf_counter() - start)
    out["after"] = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum)
    hvd.init(checks=False)  # unchecked collectives still compute the right thing
    out["unchecked"] = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum)
    out["unchecked_ag"] = hvd.allgather(torch.full((r + 1,), r))
    hvd.shutdown()
    return out


def adasum_and_sets() -> dict:
    """4 ranks: Adasum allreduce, process sets, and the collective matrix on a 4-rank group."""
    hvd.init()
    r = hvd.rank()
    out = {}
    g = [value(r, torch.float32, (5,), "ad"), value(r, torch.float64, (2, 3), "ad2")]
    out["adasum"] = hvd.grouped_allreduce(g, op=hvd.Adasum)
    out["adasum_single"] = hvd.allreduce(g[0], op=hvd.Adasum)
    even = hvd.add_process_set([0, 2])
    odd = hvd.add_process_set(hvd.ProcessSet([1, 3]))
    mine, other = (even, odd) if r % 2 == 0 else (odd, even)
    out["set_ids"] = (even.process_set_id, odd.process_set_id, mine.size(), mine.rank(), mine.included(),
                      other.included())
    out["set_allreduce"] = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=mine)
    out["set_allgather"] = hvd.allgather(torch.tensor([r]), process_set=mine)
    out["set_broadcast"] = hvd.broadcast(torch.tensor([float(r)]), root_rank=mine.ranks[-1], process_set=mine)
    out["set_adasum"] = hvd.allreduce(value(r, torch.float32, (4,), "sad"), op=hvd.Adasum, process_set=mine)
    out["set_object"] = hvd.allgather_object(r * 10, process_set=mine)
    hvd.barrier(process_set=mine)
    try:
        hvd.allreduce(torch.ones(1), process_set=other)
        out["not_member"] = "no error"
    except hvd.HorovodInternalError:
        out["not_member"] = "engine error"
    except Exception as e:  # noqa: BLE001
        out["not_member"] = str(e)
    out["removed"] = (hvd.remove_process_set(odd), hvd.remove_process_set(odd))
    hvd.remove_process_set(even)
    out["matrix"] = _matrix(("sync",))
    hvd.shutdown()
    return out


def three_ranks() -> dict:
    """3 ranks: Adasum must refuse (on every rank); uneven reducescatter; a mismatch on one rank only."""
    hvd.init()
    r = hvd.rank()
    out = {}
    for name, call in {
        "adasum": lambda: hvd.allreduce(torch.ones(3), op=hvd.Adasum),
        "one_differs": lambda: hvd.allreduce(torch.ones(4 if r == 2 else 3)),
    }.items():
        try:
            call()
            out[name] = "no error"
        except Exception as e:  # noqa: BLE001
            out[name] = f"{type(e).__name__}: {e}"
    x = value(r, torch.float32, (7, 2), "rs3")
    out["reducescatter"] = hvd.reducescatter(x, op=hvd.Sum)
    out["average"] = hvd.allreduce(value(r, torch.float32, (5,), "avg3"))
    hvd.shutdown()
    return out


# --- training -------------------------------------------------------------------------------
import os  # noqa: E402

import torch.nn.functional as F  # noqa: E402

from _hvd_expected import flat, forward, make_model, shard  # noqa: E402

SGD = lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)  # noqa: E731
ADAM = lambda params: torch.optim.Adam(params, lr=0.01)  # noqa: E731
PLAIN_SGD = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731
STEPS = 3

CONFIGS = {
    # name: (optimizer factory, DistributedOptimizer kwargs, micro-batches per step, clip)
    "sgd": (SGD, {}, 1, None),
    "bpps2": (SGD, {"backward_passes_per_step": 2}, 2, None),
    "fp16": (SGD, {"compression": "fp16"}, 1, None),
    "adam_predivide": (ADAM, {"gradient_predivide_factor": 2.0}, 1, None),
    "sum": (SGD, {"op": "Sum"}, 1, None),
    "clip": (SGD, {}, 1, 0.5),
    "groups": (SGD, {"groups": 2}, 1, None),
    "adasum": (PLAIN_SGD, {"op": "Adasum"}, 1, None),
}


def _train(factory, kwargs, k, clip, steps=STEPS, join_after=None):
    r, n = hvd.rank(), hvd.size()
    kwargs = dict(kwargs)
    if kwargs.get("compression") == "fp16":
        kwargs["compression"] = hvd.Compression.fp16
    if "op" in kwargs:
        kwargs["op"] = getattr(hvd, kwargs["op"])
    model = make_model(100 + r)  # a different start on every rank: the broadcasts must fix it
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(factory(model.parameters()), named_parameters=model.named_parameters(),
                                         **kwargs)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for step in range(steps if join_after is None else join_after):
        for micro in range(k):
            x, y = shard(step, micro, r, n, k)
            (F.cross_entropy(forward(model, x), y) / k).backward()
        if clip is not None:
            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            with optimizer.skip_synchronize():
                optimizer.step()
        else:
            optimizer.step()
        optimizer.zero_grad()
    last = hvd.join() if join_after is not None else None
    assert model["unused"].weight.grad is None
    return flat(model), last


def training() -> dict:
    hvd.init()
    r = hvd.rank()
    out = {name: _train(*config)[0] for name, config in CONFIGS.items()}
    # fusion off: one bucket per parameter (HOROVOD_FUSION_THRESHOLD=0 read at init)
    hvd.shutdown()
    os.environ["HOROVOD_FUSION_THRESHOLD"] = "0"
    hvd.init()
    del os.environ["HOROVOD_FUSION_THRESHOLD"]
    out["fusion_off"] = _train(*CONFIGS["sgd"])[0]
    out["fusion_off_buckets"] = len(hvd.DistributedOptimizer(SGD(make_model(0).parameters()))._sync.buckets)
    hvd.shutdown()
    hvd.init()
    out["fusion_on_buckets"] = len(hvd.DistributedOptimizer(SGD(make_model(0).parameters()))._sync.buckets)
    # join: rank 1 runs out of data one step early
    out["join"] = _train(SGD, {}, 1, None, join_after=STEPS + 1 if r == 0 else STEPS)
    out["strategy"] = _strategy()
    out["errors"] = _misuse()
    out["states"] = _optimizer_states()
    out["elastic"] = _elastic()
    hvd.shutdown()
    return out


def _elastic():
    """hvd.elastic.run: a failure mid-epoch rolls back to the last commit, re-initialises, resumes."""
    r, n = hvd.rank(), hvd.size()
    model = make_model(100 + r)
    optimizer = hvd.DistributedOptimizer(SGD(model.parameters()), named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(list(range(64)), shuffle=False)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)
    attempts = []

    @hvd.elastic.run
    def train(state):
        attempts.append(state.epoch)
        for epoch in range(state.epoch, STEPS):
            x, y = shard(epoch, 0, r, n, 1)
            F.cross_entropy(forward(state.model, x), y).backward()
            state.optimizer.step()
            state.optimizer.zero_grad()
            state.sampler.record_batch(epoch, 4)
            if epoch == 1 and len(attempts) == 1:
                raise hvd.HorovodInternalError("simulated failure of a collective")
            state.epoch = epoch + 1
            state.commit()
        return "finished"

    result = train(state)
    return flat(model), attempts, result, sampler.state_dict()


def _strategy():
    """strategy="hvd": module unwrapped, rank 0's weights, the optimizer reduces with accumulation."""
    from ringtrain.parallel import environments
    from ringtrain.strategies import Horovod

    r, n = hvd.rank(), hvd.size()
    strategy = Horovod().attach(environments.detect())
    strategy.setup_environment()
    model = make_model(100 + r)
    assert strategy.wrap_module(model) is model and strategy.unwrap(model) is model
    optimizer = strategy.wrap_optimizer(SGD(model.parameters()), model, backward_passes_per_step=2)
    for step in range(STEPS):
        for micro in range(2):
            x, y = shard(step, micro, r, n, 2)
            (F.cross_entropy(forward(model, x), y) / 2).backward()
        optimizer.step()
        optimizer.zero_grad()
    strategy.teardown()  # the group belongs to hvd.init here: must stay
    return flat(model)


def _misuse() -> dict:
    r, n = hvd.rank(), hvd.size()
    out = {}
    model = make_model(100)
    optimizer = hvd.DistributedOptimizer(SGD(model.parameters()), backward_passes_per_step=1)
    x, y = shard(0, 0, r, n, 1)
    F.cross_entropy(forward(model, x), y).backward()
    try:
        optimizer.zero_grad()
        out["zero_grad"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["zero_grad"] = str(e)
    try:
        F.cross_entropy(forward(model, x), y).backward()
        out["passes"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["passes"] = str(e)
    optimizer.synchronize()
    with optimizer.skip_synchronize():
        optimizer.step()
    optimizer.zero_grad()
    optimizer.set_backward_passes_per_step(3)
    out["passes_now"] = optimizer.backward_passes_per_step
    out["isinstance"] = isinstance(optimizer, torch.optim.SGD) and type(optimizer).__name__ == "SGD"
    try:
        hvd.DistributedOptimizer(SGD(model.parameters()), named_parameters=[("a", p) for p in model.parameters()])
        out["dup_names"] = "no error"
    except ValueError as e:
        out["dup_names"] = str(e)
    newer = hvd.DistributedOptimizer(SGD(model.parameters()))  # re-wrapping retires the older one
    F.cross_entropy(forward(model, x), y).backward()
    newer.step()
    try:
        optimizer.step()
        out["retired"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["retired"] = str(e)
    return out


def _optimizer_states() -> dict:
    """broadcast_optimizer_state: trained root vs fresh rank; fresh vs fresh; options like lr."""
    r = hvd.rank()
    out = {}
    model = make_model(100)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01 if r == 0 else 0.5, betas=(0.8, 0.9))
    if r == 0:  # only the root has taken steps
        for step in range(2):
            x, y = shard(step, 0, 0, 1, 1)
            F.cross_entropy(forward(model, x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    out["trained"] = optimizer.state_dict()
    fresh_model = make_model(1)
    fresh = torch.optim.SGD(fresh_model.parameters(), lr=0.3 if r == 0 else 0.7, momentum=0.5)
    before = flat(fresh_model)
    hvd.broadcast_optimizer_state(fresh, root_rank=0)
    out["fresh"] = fresh.state_dict()
    out["fresh_params_unchanged"] = torch.equal(before, flat(fresh_model))
    out["fresh_grads"] = [None if p.grad is None else p.grad.abs().sum().item() for p in fresh_model.parameters()]
    # Horovod's signature: broadcast_optimizer_state(optimizer, root_rank, model=None), model positional
    sparse_model = torch.nn.Embedding(5, 2, sparse=True)
    sparse_opt = torch.optim.SGD(sparse_model.parameters(), lr=0.1)
    hvd.broadcast_optimizer_state(sparse_opt, 0, sparse_model)
    out["sparse_init_grad_is_sparse"] = sparse_model.weight.grad.is_sparse
    return out
