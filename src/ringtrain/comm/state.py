"""Making every rank's training state equal to one rank's: parameters, optimizer state, objects.

``broadcast_parameters`` sends all tensors in one fused broadcast per device (one
engine call, not one per tensor). ``broadcast_optimizer_state`` sends the root's
whole ``state_dict`` — structure and scalars as one pickled object, tensors fused —
and loads it everywhere, so ranks end identical whatever their own state was:
fresh (empty) optimizers, different step counts, changed learning rates.

Horovod (horovod/torch/functions.py) first initialises an empty state by one local
``step()`` on zero gradients (which also moves weights under weight decay and starts
Adam's step count at 1, and leaves zero ``.grad`` tensors behind). ``initialize_state``
does exactly that for the Horovod face, which promises Horovod's observable behaviour;
``broadcast_optimizer_state`` alone sends the root's state as it is (the ``hvd``
strategy's choice) — identical state on every rank either way.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
import torch.distributed as dist

from ..errors import RingtrainError
from . import move
from .groups import ProcessSet
from .optimizer import local_step

try:  # Horovod pickles with cloudpickle (lambdas, local classes); plain pickle otherwise.
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover
    _pickler = pickle


def _dumps(obj: Any) -> torch.Tensor:
    buffer = io.BytesIO()
    _pickler.dump(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _loads(data: torch.Tensor) -> Any:
    return pickle.loads(data.numpy().tobytes())


def broadcast_object(obj: Any, root_rank: int = 0, *, process_set: ProcessSet, check: bool = True,
                     name: str | None = None) -> Any:
    """Rank ``root_rank``'s picklable ``obj`` on every member."""
    if process_set.size() == 1:
        return obj
    is_root = process_set.included() and root_rank == _me()
    payload = _dumps(obj) if is_root else torch.empty(0, dtype=torch.uint8)
    size = torch.tensor([payload.numel()], dtype=torch.int64)
    move.broadcast(size, root_rank, process_set=process_set, inplace=True, check=check, name=name).wait()
    if not is_root:
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
    move.broadcast(payload, root_rank, process_set=process_set, inplace=True, check=check, name=name).wait()
    return obj if is_root else _loads(payload)


def allgather_object(obj: Any, *, process_set: ProcessSet, check: bool = True, name: str | None = None) -> list:
    """Every member's picklable ``obj``, in rank order."""
    if process_set.size() == 1:
        return [obj]
    payload = _dumps(obj)
    sizes = move.allgather(torch.tensor([payload.numel()], dtype=torch.int64), process_set=process_set,
                           check=check, name=name).wait().tolist()
    gathered = move.allgather(payload, process_set=process_set, check=check, name=name).wait()
    out, start = [], 0
    for size in sizes:
        out.append(_loads(gathered[start:start + size]))
        start += size
    return out


def _me() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _param_list(params) -> list[tuple[str | None, torch.Tensor]]:
    if isinstance(params, dict):
        return sorted(params.items(), key=lambda kv: kv[0])
    if isinstance(params, list) or isinstance(params, tuple):
        return [p if isinstance(p, tuple) else (None, p) for p in params]
    if hasattr(params, "__iter__") and not isinstance(params, torch.Tensor):
        return [p if isinstance(p, tuple) else (None, p) for p in list(params)]
    raise ValueError(f"invalid params of type: {type(params)}")


def broadcast_tensors_(tensors: list[torch.Tensor], root_rank: int, *, process_set: ProcessSet,
                       check: bool = True) -> None:
    """Overwrite every tensor with the root's, in place, one fused broadcast per device."""
    if process_set.size() == 1 or not tensors:
        return
    by_device: dict = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t)
    for device, members in by_device.items():
        flats = [t.detach().reshape(-1).contiguous().view(torch.uint8) if t.numel() else
                 torch.empty(0, dtype=torch.uint8, device=device) for t in members]
        fused = torch.cat(flats) if len(flats) > 1 else flats[0].clone()
        layout = [(str(t.dtype), tuple(t.shape)) for t in members]
        move.broadcast(fused, root_rank, process_set=process_set, inplace=True, check=check,
                       name=f"{len(members)} fused tensors", layout=str(layout)).wait()
        start = 0
        with torch.no_grad():
            for t, flat in zip(members, flats):
                size = flat.numel()
                if size:
                    t.copy_(fused[start:start + size].view(t.dtype).view(t.shape))
                start += size


def broadcast_parameters(params, root_rank: int, *, process_set: ProcessSet, check: bool = True) -> None:
    """Horovod's ``broadcast_parameters``: a ``state_dict()``, ``named_parameters()`` or ``parameters()``."""
    tensors = [t for _, t in _param_list(params)]
    bad = [type(t).__name__ for t in tensors if not isinstance(t, torch.Tensor)]
    if bad:
        raise RingtrainError(f"broadcast_parameters got non-tensor values ({sorted(set(bad))})",
                             "pass model.state_dict(), model.named_parameters() or model.parameters().")
    broadcast_tensors_(tensors, root_rank, process_set=process_set, check=check)


def _split(value, tensors: list) -> Any:
    """Replace tensors in a nested structure by placeholders, collecting them in order."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return ("__tensor__", len(tensors) - 1, str(value.dtype), tuple(value.shape), value.device.type)
    if isinstance(value, dict):
        return {k: _split(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_split(v, tensors) for v in value)
    return value


def _join(value, tensors: list) -> Any:
    if isinstance(value, tuple) and len(value) == 5 and value[0] == "__tensor__":
        return tensors[value[1]]
    if isinstance(value, dict):
        return {k: _join(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_join(v, tensors) for v in value)
    return value


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, *, process_set: ProcessSet,
                              check: bool = True) -> None:
    """Load the root's full optimizer state (tensors, scalars, param-group options) on every member."""
    if process_set.size() == 1:
        return
    is_root = root_rank == _me()
    local: list[torch.Tensor] = []
    skeleton = _split(optimizer.state_dict(), local) if is_root else None
    skeleton = broadcast_object(skeleton, root_rank, process_set=process_set, check=check, name="optimizer state")
    if is_root:
        tensors = local
    else:
        placeholders: list = []
        _collect(skeleton, placeholders)
        device = _param_device(optimizer)
        tensors = [torch.empty(shape, dtype=getattr(torch, dtype.replace("torch.", "")),
                               device=device if kind == device.type else torch.device(kind))
                   for _, _, dtype, shape, kind in sorted(placeholders, key=lambda p: p[1])]
    broadcast_tensors_(tensors, root_rank, process_set=process_set, check=check)
    if not is_root:
        optimizer.load_state_dict(_join(skeleton, tensors))


def initialize_state(optimizer: torch.optim.Optimizer, model=None) -> None:
    """Horovod's initialisation of a fresh optimizer: zero gradients, one local step (no communication).

    Sparse gradients where Horovod makes them: for SparseAdam, and for SGD on the parameters of
    ``nn.Embedding(sparse=True)`` modules of ``model``.
    """
    if optimizer.state_dict()["state"]:
        return
    sparse = set()
    if model is not None:
        sparse = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.sparse
                  for p in m.parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
                if isinstance(optimizer, torch.optim.SparseAdam) or (
                        isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                    p.grad = p.grad.to_sparse()
    local_step(optimizer)


def _collect(value, out: list) -> None:
    if isinstance(value, tuple) and len(value) == 5 and value[0] == "__tensor__":
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _collect(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect(v, out)


def _param_device(optimizer) -> torch.device:
    for group in optimizer.param_groups:
        for p in group["params"]:
            return p.device
    return torch.device("cpu")
