"""One training step of one layout, traced on fake tensors under a fake process group: memory, FLOPs, traffic.

Nothing is allocated and no process group forms: the model is copied to the meta device (its parameters' shapes
only), the layout is applied there — torch's ``parallelize_module`` for tensor parallelism (the TP plan of
strategies/_tp_plan.py), ``fully_shard`` on FSDP's units (strategies/_units.py), activation checkpointing on the
repeated blocks (strategies/checkpointing.py) — outside ``FakeTensorMode`` (inside it the mesh code fails on
``aten.nonzero``), then made fake (``to_empty`` under the mode), the optimizer's state made by a step on zero
gradients, and one training step run (forward, loss, backward, optimizer step: the steady state, the optimizer's
state held throughout) under torch's memory tracker (``MemTracker``; FSDP's own ``FSDPMemTracker`` for sharded
layouts) and a counter of the collectives' bytes; then, where asked, one more under torch's ``FlopCounterMode``.

DDP is traced as one device plus its gradient buckets (torch's reducer copies every gradient into buckets it
allocates in C++ when it is built, which a fake tensor cannot run), and its all-reduce volume by formula.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only

from ..errors import RingtrainError
from ..strategies import _tp_apply, _tp_plan, _units
from ..strategies.checkpointing import apply_activation_checkpointing
from .layouts import Layout

PARTS = ("parameters", "gradients", "optimizer", "activations", "temporaries")


@dataclass
class Measured:
    """What one layout's traced step holds at its peak on one rank (bytes), and what it computes and sends."""

    peak: int
    parts: dict[str, int]
    flops: int  # this rank's, one step (recomputation included)
    traffic: dict[str, int] = field(default_factory=dict)  # mesh dim -> bytes one rank sends per step
    host: int = 0  # CPU offload: what lives in host memory instead


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[None]:
    """A fake process group of ``world_size`` ranks as this process's default group, seen as rank 0 (every rank of
    a layout holds the same): collectives return at once and move nothing."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RingtrainError("a plan was asked for in a process that already formed a process group",
                             "plan before forming the group (rt.plan before ring.setup, or `ringtrain plan`).")
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def to_meta(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are meta tensors of the same shapes: nothing is copied."""
    memo: dict[int, Any] = {}
    for t in (*model.parameters(), *model.buffers()):
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(model, memo)


def checkpoint_blocks(model: nn.Module, mode: str) -> list[str]:
    """Activation checkpointing on the repeated blocks in place, as ``Ring(activation_checkpointing=mode)`` does it
    (strategies/checkpointing.py); the blocks' names."""
    return apply_activation_checkpointing(model, None if mode == "off" else mode)


def _mesh(layout: Layout) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    names, sizes = zip(*layout.dims) if layout.dims else ((), ())
    return init_device_mesh("cpu", tuple(sizes), mesh_dim_names=tuple(names)) if names else None


def apply_layout(meta: nn.Module, layout: Layout, dtype: torch.dtype | None) -> nn.Module:
    """``meta`` (on the meta device, outside the fake mode) cut and sharded as ``layout`` says, in the strategies'
    order: the TP plan, activation checkpointing, FSDP's units then the model."""
    mesh = _mesh(layout)
    if layout.tp > 1:
        plan = _tp_plan.infer(meta, layout.tp, False)
        _tp_apply.apply(meta, plan, mesh["tp"], layout.tp)
    units = _units.choose(meta, "auto") if layout.data == "fsdp" else []
    checkpoint_blocks(meta, layout.ac)
    if layout.data == "fsdp":
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        dims = tuple(n for n, _ in layout.dims if n != "tp")
        sub = mesh[dims if len(dims) > 1 else dims[0]]
        mp = (MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
              if dtype is not None else MixedPrecisionPolicy())
        offload = CPUOffloadPolicy(pin_memory=False) if layout.offload else OffloadPolicy()
        for name in units:
            fully_shard(meta.get_submodule(name), mesh=sub, mp_policy=mp, offload_policy=offload)
        fully_shard(meta, mesh=sub, reshard_after_forward=False, mp_policy=mp, offload_policy=offload)
    return meta


def optimizer_like(optimizer: torch.optim.Optimizer, original: nn.Module, model: nn.Module) -> torch.optim.Optimizer:
    """An optimizer of ``optimizer``'s class, groups and hyperparameters over ``model``'s parameters (found by the
    names they have in ``original``)."""
    names = {id(p): n for n, p in original.named_parameters(remove_duplicate=False)}
    params = dict(model.named_parameters())
    groups = []
    for group in optimizer.param_groups:
        found = [params[names[id(p)]] for p in group["params"] if id(p) in names]
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": found})
    accepted = inspect.signature(type(optimizer).__init__).parameters
    return type(optimizer)(groups, **{k: v for k, v in optimizer.defaults.items() if k in accepted})


def default_loss(output: Any) -> torch.Tensor:
    """The loss a plan trains when none is given: the output itself when it is one number (a model that takes its
    targets), else cross-entropy over the last dimension (a classifier, a language model's logits)."""
    tensors = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not tensors:
        raise RingtrainError("the model's output holds no floating-point tensor to train on",
                             "give rt.plan a loss_fn(output, batch) that returns the loss.")
    scalar = next((t for t in tensors if t.dim() == 0), None)
    if scalar is not None:
        return scalar
    out = tensors[0]
    if out.dim() < 2 or out.shape[-1] < 2:
        return out.float().square().mean()
    logits = out.flatten(0, -2)
    return F.cross_entropy(logits.float(), torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device))


# --- what the step sends ------------------------------------------------------------------------------------------
_SENDS = {  # op name (prefix) -> the share of the full tensor one rank sends, over a group of n (ring algorithms)
    "all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
}


class Traffic(TorchDispatchMode):
    """Bytes one rank sends in the functional collectives dispatched (DTensor's, under tensor parallelism): the full
    tensor's size times the ring algorithm's share. FSDP's and DDP's traffic is counted by formula
    (``data_traffic``)."""

    def __init__(self, group_size: int):
        super().__init__()
        self.n = group_size
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.namespace == "_c10d_functional" and self.n > 1:
            op = func._schema.name.split("::")[-1]
            share = next((f for k, f in _SENDS.items() if op.startswith(k)), None)
            if share is not None:
                full = out if "gather" in op else args[0]
                tensors = [t for t in tree_flatten(full)[0] if isinstance(t, torch.Tensor)]
                self.bytes += int(sum(t.numel() * t.element_size() for t in tensors) * share(self.n))
        return out


def data_traffic(model: nn.Module, layout: Layout, dtype: torch.dtype | None) -> dict[str, int]:
    """Bytes one rank sends per step over the data dimensions: DDP's all-reduce of the gradients; FSDP's all-gather
    of the parameters in forward and again in backward, the reduce-scatter of the gradients; HSDP's all-reduce of
    the shards across replicas (ring algorithms; gradients reduced in fp32)."""
    count = sum(p.numel() for p in model.parameters() if p.requires_grad) / layout.tp
    param_bytes = (torch.finfo(dtype).bits // 8) if dtype is not None else 4
    if layout.data == "ddp":
        n = layout.dp_replicate
        return {"dp_replicate": int(count * 4 * 2 * (n - 1) / n)}
    if layout.data != "fsdp":
        return {}
    n, r = layout.dp_shard, layout.dp_replicate
    sent = {"dp_shard": int(count * (2 * param_bytes + 4) * (n - 1) / n)}
    if r > 1:
        sent["dp_replicate"] = int(count / n * 4 * 2 * (r - 1) / r)
    return sent


# --- FLOPs ----------------------------------------------------------------------------------------------------------
def _flop_counter() -> Any:
    """torch's FlopCounterMode, which also counts the CPU's attention kernels (it has formulas for the GPU's only)."""
    from torch.utils import flop_counter as fc

    def forward(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return fc.sdpa_flop_count(query, key, value)

    def backward(grad: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return fc.sdpa_backward_flop_count(grad, query, key, value)

    aten = torch.ops.aten
    mapping = {}
    for name, formula in (("_scaled_dot_product_flash_attention_for_cpu", forward),
                          ("_scaled_dot_product_flash_attention_for_cpu_backward", backward)):
        op = getattr(aten, name, None)
        if op is not None:
            mapping[op] = formula
    return _local_counter()(display=False, custom_mapping=mapping)


def _local_counter() -> type:
    """FlopCounterMode counting this rank's local computation: a DTensor op (global shapes) is left to DTensor,
    whose local ops are counted."""
    from torch.distributed.tensor import DTensor
    from torch.utils.flop_counter import FlopCounterMode, _FlopCounterMode

    class LocalFlops(_FlopCounterMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if any(t is DTensor for t in types):
                return NotImplemented
            return super().__torch_dispatch__(func, types, args, kwargs)

    class Counter(FlopCounterMode):
        def __enter__(self) -> Any:
            self.flop_counts.clear()
            self.mod_tracker.__enter__()
            self.mode = LocalFlops(self)
            self.mode.__enter__()
            return self

    return Counter


# --- the step -------------------------------------------------------------------------------------------------------
_FSDP_PARTS = {"Sharded Param": "parameters", "Unsharded Param": "parameters", "Buffer": "parameters",
               "Sharded Grad": "gradients", "Unsharded Grad": "gradients", "OptState": "optimizer",
               "Activation": "activations", "Inputs": "activations", "Temp": "temporaries",
               "All Gather": "temporaries", "Reduce Scatter": "temporaries"}
_PARTS = {"Parameter": "parameters", "Buffer": "parameters", "Gradient": "gradients", "Optstate": "optimizer",
          "Activation": "activations", "Temp": "temporaries", "Other": "temporaries"}


def _split(snapshot: dict[Any, dict[Any, int]]) -> tuple[int, dict[str, int]]:
    parts = dict.fromkeys(PARTS, 0)
    total = 0
    for dev_snap in snapshot.values():
        for key, value in dev_snap.items():
            if key == "Total":
                total += value
                continue
            label = getattr(key, "value", key)
            parts[_FSDP_PARTS.get(label) or _PARTS.get(label, "temporaries")] += value
    return total, parts


def _trackers() -> dict[bool, type]:
    """torch's MemTracker (False) and FSDPMemTracker (True), keeping the step's peak only: torch's own also updates
    every module's peak at every op, which costs more than the rest of the trace on a model of many modules."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    def peak_only(self: Any, peak_state: Any) -> None:
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap["Total"]:
                self._peak_mem[dev] = snap["Total"]
                self._peak_mem_snap[dev] = dict(snap)

    return {False: type("PeakMemTracker", (MemTracker,), {"_update_peak_stats": peak_only}),
            True: type("PeakFSDPMemTracker", (FSDPMemTracker,), {"_update_peak_stats": peak_only})}


def trace(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any, layout: Layout, *,
          dtype: torch.dtype | None = None, loss_fn: Callable[..., torch.Tensor] | None = None,
          count_flops: bool = True) -> Measured:
    """Trace a training step of ``layout`` (on the fake world ``fake_world`` formed) with the optimizer's state made
    first, under the memory tracker: its peak; and, with ``count_flops``, another under the FLOP counter."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cut = apply_layout(to_meta(model), layout, dtype)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        cut.to_empty(device="cpu")
        with torch.no_grad():
            for t in cut.buffers():
                t.zero_()
        opt = optimizer_like(optimizer, model, cut)
        fake_batch = tree_map_only(torch.Tensor, lambda t: mode.from_tensor(t) if not t.is_meta
                                   else torch.empty_like(t, device="cpu"), batch)
        sharded = layout.data == "fsdp"
        autocast = (lambda: torch.autocast("cpu", dtype=dtype)) if dtype is not None and not sharded else (
            contextlib.nullcontext)
        _make_state(cut, opt)  # the optimizer's state, held by the traced step throughout, as from step 2 on
        tracker = _trackers()[sharded](cut, opt) if sharded else _trackers()[sharded]()
        if sharded:
            tracker.track_inputs(fake_batch)
        else:
            tracker.track_external(cut, opt, fake_batch)
        traffic = Traffic(layout.tp)
        with tracker, traffic:
            _step(cut, opt, fake_batch, loss_fn, autocast)
        flops = _flop_counter() if count_flops else None
        if flops is not None:
            with flops:  # a step of its own: under the tracker, the counter's handling of recomputation shows as memory
                _step(cut, opt, fake_batch, loss_fn, autocast)
        peak, parts = _split(tracker.get_tracker_snapshot("peak"))
    sent = {**data_traffic(model, layout, dtype), **({"tp": traffic.bytes} if layout.tp > 1 else {})}
    measured = Measured(peak=peak, parts=parts, flops=int(flops.get_total_flops()) if flops is not None else 0,
                        traffic=sent)
    if layout.data == "ddp":
        _add_ddp(measured, model, layout)
    if layout.offload:
        _offload(measured)
    return measured


def _make_state(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """The optimizer's state, made by a step on zero gradients (no forward or backward needed)."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)


def _step(model: nn.Module, opt: torch.optim.Optimizer, batch: Any, loss_fn: Any, autocast: Any) -> None:
    with autocast():
        output = _call(model, batch)
        loss = loss_fn(output, batch) if loss_fn is not None else default_loss(output)
    del output
    loss.backward()
    del loss
    opt.step()
    opt.zero_grad()


def _call(model: nn.Module, batch: Any) -> Any:
    """The model on one batch, which is what it takes: a dict as keywords, a tuple or list as positional arguments,
    anything else as its one argument."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _grad_bytes(model: nn.Module, tp: int) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad) // tp


def _add_ddp(measured: Measured, model: nn.Module, layout: Layout) -> None:
    """DDP's reducer: buckets holding a copy of every gradient (allocated when it is built, held for the job), and
    one all-reduce of them per step (``data_traffic``)."""
    buckets = _grad_bytes(model, layout.tp)
    measured.parts["gradients"] += buckets
    measured.peak += buckets


def _offload(measured: Measured) -> None:
    """FSDP's CPU offload: the sharded parameters, their gradients and the optimizer's state live in host memory;
    the device holds what is gathered for compute, the activations and temporaries."""
    # The tracker traced everything on the CPU; FSDPMemTracker's parameter share at the peak is mostly the
    # gathered units, so only the optimizer state (wholly sharded, on the host) and the sharded gradients move.
    moved = measured.parts["optimizer"] + measured.parts["gradients"]
    measured.host = moved
    # Each step the gradients go down and the updated parameters come back, and the CPU's optimizer step reads and
    # writes its state: twice what moved, over the host link (cost.py: HOST_GBPS, not hidden).
    measured.traffic["host"] = 2 * moved
    measured.parts["optimizer"] = 0
    measured.parts["gradients"] = 0
    measured.peak -= moved
