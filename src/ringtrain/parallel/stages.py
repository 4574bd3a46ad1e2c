"""Cut a model into stages by module name; run the stages on several devices in one process.

    model = nn.Sequential(stem, body, head)           # nested Sequentials are fine
    model = rt.split(model, devices=["cuda:0", "cuda:1"], at=["body.3"], microbatches=4)
    out = model(x)                                    # activations hop cuda:0 -> cuda:1
    loss = F.cross_entropy(out, y.to(out.device))     # the output is on the last device
    loss.backward(); optimizer.step()                 # autograd carries gradients back
    torch.save(model.state_dict(), "m.pt")            # the unsplit model's keys

What can be cut: an ``nn.Sequential`` (with Sequentials nested in it) at the
name of any module on a path of Sequentials (``"4"``, ``"body.3"``), or a list
of stage modules the user already wrote. Arbitrary ``forward`` code cannot be
cut without knowing it: torch's tracer (``torch.distributed.pipelining.pipeline``
with ``SplitPoint``) can, but it bakes train/eval mode and shapes into a graph,
so ringtrain asks for a Sequential instead and says how.

Every stage keeps the unsplit model's names (``Stage`` is a Sequential holding
the same submodules under the same keys), so the stages' state dicts together
are exactly the unsplit model's. ``cut`` is shared with the cross-process
pipeline strategy (strategies/pipeline.py); ``Split`` is the one-process
runner: with ``microbatches=M`` it runs the GPipe wavefront (Huang et al. 2019,
"GPipe"; the PyTorch model-parallel tutorial's "pipelining inputs"): at clock
t, stage s works on micro-batch t-s, so on GPUs consecutive stages overlap
(CUDA kernels are queued asynchronously per device).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..errors import RingtrainError

_SHOW = 24  # names listed in a HINT before "..."


class Stage(nn.Sequential):
    """One stage: modules run in order, registered under their names in the unsplit model.

    ``unpack``: a stage the user wrote takes the previous stage's tuple output as
    separate arguments (what ``torch.distributed.pipelining`` passes); a cut of a
    Sequential takes it as one value, as the unsplit Sequential did.
    """

    def __init__(self, modules: OrderedDict[str, nn.Module], unpack: bool = False):
        super().__init__(modules)
        self.unpack = unpack

    def forward(self, *args: Any) -> Any:  # type: ignore[override]
        modules = iter(self)
        first = next(modules)
        out = first(*args) if self.unpack else first(args[0] if len(args) == 1 else args)
        for module in modules:
            out = module(out)
        return out


def _is_plain_sequential(module: nn.Module) -> bool:
    # A subclass with its own forward does something a chain of children does not.
    return isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward


def cuttable_names(model: nn.Module, prefix: str = "") -> list[str]:
    """Names ``cut`` accepts: modules reached from ``model`` through plain Sequentials only."""
    names: list[str] = []
    if not _is_plain_sequential(model):
        return names
    for name, child in model.named_children():
        full = f"{prefix}{name}"
        names.append(full)
        names.extend(cuttable_names(child, full + "."))
    return names


def _show(names: Sequence[str]) -> str:
    return ", ".join(names[:_SHOW]) + (f", ... ({len(names) - _SHOW} more)" if len(names) > _SHOW else "")


def _cut_sequential(seq: nn.Sequential, cuts: list[list[str]]) -> list[OrderedDict[str, nn.Module]]:
    """Pieces of ``seq`` between cut points; each keeps the names the modules had in ``seq``."""
    pieces: list[OrderedDict[str, nn.Module]] = [OrderedDict()]
    for name, child in seq.named_children():
        if [name] in cuts:
            pieces.append(OrderedDict())
        inner = [c[1:] for c in cuts if c[0] == name and len(c) > 1]
        if not inner:
            pieces[-1][name] = child
            continue
        parts = _cut_sequential(child, inner)  # a cut inside: the child's pieces go to consecutive stages
        if parts[0]:
            pieces[-1][name] = nn.Sequential(parts[0])
        for part in parts[1:]:
            pieces.append(OrderedDict({name: nn.Sequential(part)}))
    return pieces


def cut(model: nn.Module | Sequence[nn.Module], at: Sequence[str] | None) -> tuple[list[Stage], nn.Module]:
    """Split ``model`` before each module named in ``at``; return ``(stages, root)``.

    ``root`` is the module whose state dict is the unsplit one (``model`` itself,
    or an ``nn.ModuleList`` of the stages when a list of stage modules was given);
    the stages share its parameters (the same tensors, not copies).
    """
    if isinstance(model, (list, tuple, nn.ModuleList)):
        if at:
            raise RingtrainError(
                f"got both a list of {len(model)} stage modules and split points at={list(at)}",
                "pass either the stages as a list, or one nn.Sequential model with at=[module names].",
            )
        if not model or not all(isinstance(m, nn.Module) for m in model):
            raise RingtrainError("the list of stages is empty or holds something that is not an nn.Module", "pass [stage0, stage1, ...].")
        root = model if isinstance(model, nn.ModuleList) else nn.ModuleList(model)
        return [Stage(OrderedDict({str(i): m}), unpack=True) for i, m in enumerate(root)], root
    if not isinstance(model, nn.Module):
        raise RingtrainError(f"cannot split a {type(model).__name__}", "pass an nn.Sequential or a list of stage modules.")
    at = [at] if isinstance(at, (str, int)) else list(at or [])
    # An integer is a position in the top-level Sequential, as users write it: at=[2] is at=["2"].
    at = [str(a) if isinstance(a, int) and not isinstance(a, bool) else a for a in at]
    if not all(isinstance(a, str) for a in at):
        raise RingtrainError(f"split points must be module names or positions, got at={at!r}",
                             "e.g. at=[2], at=['4'] or at=['body.3'].")
    if at and not _is_plain_sequential(model):
        raise RingtrainError(
            f"{type(model).__name__} has its own forward(), which ringtrain cannot cut at {at} without knowing "
            "what runs between its modules",
            "write the model as nn.Sequential(...) (nn.Flatten() where forward flattens, small nn.Module "
            "wrappers for the rest) and cut it by child name, or pass the stages as a list [stage0, stage1, ...].",
        )
    names = cuttable_names(model)
    order = {name: i for i, name in enumerate(names)}
    unknown = [a for a in at if a not in order]
    if unknown:
        raise RingtrainError(
            f"split point(s) {unknown} are not modules of this {type(model).__name__} that it runs in sequence",
            f"use names from model.named_modules() reached through Sequentials; available: {_show(names)}.",
        )
    if len(set(at)) != len(at):
        raise RingtrainError(f"split points repeat: at={at}", "name each split point once.")
    at = sorted(at, key=order.__getitem__)  # stages run in model order, whatever order the names came in
    pieces = _cut_sequential(model, [a.split(".") for a in at])  # type: ignore[arg-type]
    stages = [Stage(p) for p in pieces]
    for i, stage in enumerate(stages):
        if not any(not isinstance(m, nn.Sequential) for m in stage.modules()):
            raise RingtrainError(
                f"split points {at} leave stage {i} without any module (a cut before the first module, "
                "or two cuts with nothing between them)",
                "put every split point after at least one module of the previous stage.",
            )
    covered = {k for s in stages for k in s.state_dict()}
    orphans = [k for k in model.state_dict() if k not in covered]
    if orphans:  # state registered on a container itself belongs to no stage
        raise RingtrainError(
            f"{type(model).__name__} holds state outside its child modules ({_show(orphans)}), which no stage would own",
            "move those parameters/buffers into a child module.",
        )
    return stages, model


def spans_devices(module: nn.Module) -> bool:
    """Are ``module``'s parameters and buffers on more than one device (a model split by hand or rt.split)?"""
    return len({t.device for t in (*module.parameters(), *module.buffers())}) > 1


def release(root: nn.Module, keep: Sequence[nn.Module]) -> None:
    """Move every parameter and buffer of ``root`` that no module in ``keep`` holds to the meta device.

    The tensor shapes stay (the model still describes itself) but their memory
    is returned: this is what makes a pipeline rank hold ~1/S of the model.
    """
    kept = {id(t) for m in keep for t in (*m.parameters(), *m.buffers())}
    for module in root.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in kept and param.device.type != "meta":
                setattr(module, name, nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad))
        for name, buf in list(module.named_buffers(recurse=False)):
            if id(buf) not in kept and buf.device.type != "meta":
                setattr(module, name, buf.to("meta"))


def meta_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are on the meta device (its data is never copied)."""
    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = nn.Parameter(p.detach().to("meta"), requires_grad=p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = b.detach().to("meta")
    return copy.deepcopy(module, memo)


def as_args(value: Any) -> tuple:
    """A stage's output as the next stage's positional arguments (tuples are spread, as torch pipelining does)."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def meta_shapes(stages: Sequence[nn.Module], micro: torch.Tensor) -> list[tuple[tuple, tuple]] | None:
    """(inputs, outputs) of every stage for a micro-batch like ``micro``, as meta tensors; None if unknowable.

    Every stage runs on the meta device (``torch.func.functional_call`` with meta copies of its
    parameters and buffers: no memory, no compute, no side effects), whether its real tensors are
    here or were released. Given these shapes, torch's ``PipelineStage`` runs in its static mode;
    left to infer them (dynamic mode) it runs one real forward per stage, on uninitialised tensors
    in all but the first stage — which corrupts BatchNorm running statistics there (inf/NaN) and
    counts the first micro-batch twice in the first. Data-dependent shapes (boolean masks,
    ``nonzero``, ``.item()``) cannot be worked out on meta tensors: None then — and only then (a
    NotImplementedError or RuntimeError from the meta kernels); any other error is the model's own
    and is raised. The caller decides whether the dynamic mode is safe (``dynamic_mode_problem``).
    """
    shapes = []
    args: tuple = (micro.detach().to("meta"),)
    try:
        with torch.random.fork_rng(devices=[]):
            for stage in stages:
                state = {n: t.to("meta") for n, t in (*stage.named_parameters(), *stage.named_buffers())}
                outs = as_args(torch.func.functional_call(stage, state, args))
                shapes.append((args, outs))
                args = tuple(o.detach().requires_grad_(o.requires_grad) for o in outs)
    except (NotImplementedError, RuntimeError):  # the meta kernels cannot know these shapes in advance
        return None
    return shapes


def dynamic_mode_problem(stages: Sequence[nn.Module]) -> RingtrainError | None:
    """Why torch's shape-inferring mode must not run these stages (BatchNorm after the first stage), if it must not."""
    late = [f"stage {i}: {type(m).__name__}" for i, stage in enumerate(stages) if i > 0
            for m in stage.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not late:
        return None
    return RingtrainError(
        f"the pipeline cannot work out its stages' shapes in advance (a data-dependent shape, e.g. a boolean "
        f"mask or nonzero()), and letting torch infer them would run BatchNorm on uninitialised tensors "
        f"({', '.join(late[:3])}): its running statistics would turn to inf/NaN",
        "make shapes at stage boundaries independent of the data (pad to a fixed length), or place the "
        "split points so that BatchNorm layers sit in the first stage.",
    )


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to(v, device) for v in value)
    return value


def _cat(outputs: list[Any]) -> Any:
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outputs)
    if isinstance(first, (tuple, list)):
        return type(first)(_cat([o[i] for o in outputs]) for i in range(len(first)))
    raise RingtrainError(
        f"micro-batched outputs of type {type(first).__name__} cannot be joined back into one batch",
        "return a tensor (or a tuple of tensors) from the last stage, or use microbatches=None.",
    )


def _default_devices(n: int) -> list[torch.device]:
    count = torch.cuda.device_count()
    if count == 0:
        return [torch.device("cpu")] * n
    if count < n:
        raise RingtrainError(
            f"{n} stages need {n} devices, but torch sees {count} GPU(s)",
            "pass devices=[...] explicitly (devices may repeat, e.g. ['cuda:0', 'cuda:0', 'cuda:1']), or cut fewer stages.",
        )
    return [torch.device("cuda", i) for i in range(n)]


class Split(nn.Module):
    """Stages on their devices, run as one model. ``state_dict()`` is the unsplit model's.

    The unsplit model's top-level children (and its own parameters/buffers, if
    any) are registered here under their own names, so ``state_dict``,
    ``load_state_dict``, ``parameters``, ``train``/``eval`` see exactly the
    unsplit model; the stages (same submodules) only decide what runs where.
    Do not call ``.to(device)`` on it: that would gather every stage on one device.
    """

    def __init__(self, stages: list[Stage], root: nn.Module, devices: list[torch.device], microbatches: int | None):
        super().__init__()
        for name, child in root.named_children():
            self.add_module(name, child)
        for name, param in root.named_parameters(recurse=False):
            self.register_parameter(name, param)
        for name, buf in root.named_buffers(recurse=False):
            self.register_buffer(name, buf)
        self._stages = list(stages)  # a plain list: the modules are registered once, above
        self.devices = devices
        self.microbatches = microbatches
        for stage, device in zip(stages, devices):
            stage.to(device)

    @property
    def stages(self) -> list[Stage]:
        return list(self._stages)

    def _run(self, s: int, args: tuple) -> Any:
        return self._stages[s](*_to(args, self.devices[s]))

    def forward(self, *args: Any) -> Any:
        if not self.microbatches or self.microbatches == 1:
            out: Any = args
            for s in range(len(self._stages)):
                out = self._run(s, as_args(out) if s else args)
            return out
        if not args or not all(isinstance(a, torch.Tensor) and a.dim() > 0 for a in args):
            raise RingtrainError(
                "micro-batching needs the forward arguments to be batched tensors (cut along dim 0)",
                "pass tensors whose first dimension is the batch, or use microbatches=None.",
            )
        n = min(self.microbatches, args[0].shape[0])
        chunks = list(zip(*(a.tensor_split(n) for a in args)))
        stages = len(self._stages)
        held: list[Any] = [None] * stages  # held[s]: stage s's latest output, waiting for stage s+1
        outputs: list[Any] = []
        for clock in range(n + stages - 1):
            # Later stages first, so each consumes held[s-1] before stage s-1 refills it this clock.
            for s in reversed(range(stages)):
                mb = clock - s
                if not 0 <= mb < n:
                    continue
                out = self._run(s, chunks[mb] if s == 0 else as_args(held[s - 1]))
                if s == stages - 1:
                    outputs.append(out)
                else:
                    held[s] = out
        return _cat(outputs)


def split(
    model: nn.Module | Sequence[nn.Module],
    devices: Sequence[str | torch.device] | None = None,
    at: Sequence[str] | None = None,
    microbatches: int | None = None,
) -> Split:
    """Cut ``model`` before each module named in ``at`` and place stage i on ``devices[i]``.

    ``model``: an ``nn.Sequential`` (cut by module name, nested Sequentials
    included) or a list of stage modules (then ``at`` is not given and the state
    dict is that of ``nn.ModuleList(stages)``). ``devices``: one per stage
    (default: one GPU each, or the CPU without GPUs). ``microbatches=M``: cut
    each batch into M chunks along dim 0 and pipeline them through the stages
    (outputs are concatenated back; BatchNorm then normalises per chunk).
    The output is on the last stage's device.
    """
    stages, root = cut(model, at)
    if devices is None:
        placed = _default_devices(len(stages))
    else:
        placed = [torch.device(d) for d in devices]
        if len(placed) != len(stages):
            raise RingtrainError(
                f"{len(stages)} stage(s) but {len(placed)} device(s) were given",
                f"give one device per stage: {len(stages) - 1} split point(s) make {len(stages)} stages.",
            )
    if microbatches is not None and (isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1):
        raise RingtrainError(f"split got microbatches={microbatches!r}", "use a positive integer, or None for whole batches.")
    return Split(stages, root, placed, microbatches)
