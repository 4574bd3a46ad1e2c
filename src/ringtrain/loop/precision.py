"""Numeric precision: ``"32"``, ``"bf16-mixed"``, ``"16-mixed"``.

One object per choice, each with the same three pieces, so the training step
has no branches (nanoGPT's ``nullcontext`` vs ``autocast``, and
``GradScaler(enabled=...)``):

* ``autocast()`` — the context the model's forward runs in;
* ``scaler`` — a ``torch.amp.GradScaler`` that is enabled only for float16,
  whose dynamic loss scale keeps small gradients from flushing to zero and
  skips steps whose gradients overflowed (Micikevicius et al. 2018, "Mixed
  Precision Training"); bfloat16 has float32's exponent range and needs none;
* ``wrap_forward(module)`` — makes ``module(x)`` run under ``autocast()`` and
  return float32 outputs, so a loss computed outside the model is float32.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch
from torch import nn

from ..errors import RingtrainError

PRECISIONS = ("32", "bf16-mixed", "16-mixed")
_ALIASES = {"32": "32", "32-true": "32", "fp32": "32", "float32": "32", "bf16-mixed": "bf16-mixed",
            "bf16": "bf16-mixed", "bfloat16": "bf16-mixed", "16-mixed": "16-mixed", "fp16": "16-mixed",
            "16": "16-mixed", "float16": "16-mixed", "half": "16-mixed"}
_DTYPES = {torch.float32: "32", torch.bfloat16: "bf16-mixed", torch.float16: "16-mixed"}


def cuda_properties(index: int) -> Any:
    """The properties (``name``, ``major``, ``minor``) of GPU ``index``: the one CUDA query the
    bfloat16 check makes, so tests can stand in for a GPU they do not have."""
    return torch.cuda.get_device_properties(index)


def bf16_problem(device: torch.device) -> str | None:
    """Why bfloat16 autocast should not run on ``device``, or None.

    A GPU below compute capability 8.0 (before Ampere) has no bfloat16 arithmetic;
    ``torch.cuda.is_bf16_supported()`` still says yes there, counting emulation (much
    slower than float16), and it asks the *current* GPU, which is cuda:0 until the
    strategy sets the device — so every process would ask GPU 0. The device's own
    index is asked instead, which needs no set_device.
    """
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = cuda_properties(index)
    if (props.major, props.minor) >= (8, 0):
        return None
    return (f"{props.name} (cuda:{index}, compute capability {props.major}.{props.minor}) has no bfloat16 "
            "arithmetic; it needs 8.0 or newer (Ampere)")


def _to_float32(output: Any) -> Any:
    if isinstance(output, torch.Tensor):
        return output.float() if output.is_floating_point() and output.dtype != torch.float32 else output
    if isinstance(output, dict):
        return type(output)({k: _to_float32(v) for k, v in output.items()})
    if isinstance(output, tuple) and hasattr(output, "_fields"):
        return type(output)(*(_to_float32(v) for v in output))
    if isinstance(output, (list, tuple)):
        return type(output)(_to_float32(v) for v in output)
    return output


def canonical(name: Any) -> str:
    """The precision's canonical name: ``"bf16"``, ``"bfloat16"`` and ``torch.bfloat16`` are ``"bf16-mixed"``
    (a script's own ``dtype`` setting, as it has it); a clear error for unknown ones."""
    if isinstance(name, torch.dtype) and name in _DTYPES:
        return _DTYPES[name]
    if isinstance(name, (str, int)) and not isinstance(name, bool) and str(name).lower() in _ALIASES:
        return _ALIASES[str(name).lower()]
    raise RingtrainError(f"unknown precision {name!r}",
                         f"use one of {', '.join(PRECISIONS)} (or a torch dtype, or 'float16'/'bfloat16'/'float32').")



class Precision:
    """Mixed or full precision for one device type."""

    def __init__(self, name: str, device: torch.device):
        self.name = canonical(name)
        self.device_type = device.type
        self.dtype = {"32": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}[self.name]
        if self.dtype is not None and not torch.amp.is_autocast_available(self.device_type):
            raise RingtrainError(
                f"precision={name!r} needs autocast on {self.device_type}, which this torch build lacks",
                "use precision='32'.",
            )
        problem = bf16_problem(device) if self.dtype is torch.bfloat16 else None
        if problem:
            raise RingtrainError(
                f"precision='bf16-mixed' was asked for, but {problem}",
                "use precision='16-mixed' on pre-Ampere GPUs (with its loss scaling), or '32'.",
            )
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=self.dtype is torch.float16)

    @property
    def mixed(self) -> bool:
        return self.dtype is not None

    def autocast(self) -> ContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def wrap_forward(self, module: nn.Module) -> None:
        """Run ``module``'s forward under autocast from now on, returning float32 outputs.

        Forward hooks rather than a replaced ``forward``: the module tree, its
        state dict and ``copy.deepcopy`` stay ordinary, and ``always_call=True``
        closes the autocast region even when forward raises.
        """
        if not self.mixed or getattr(module, "_ringtrain_autocast", False):
            return
        regions: list[ContextManager] = []

        def enter(mod: nn.Module, args: Any) -> None:
            region = self.autocast()
            region.__enter__()
            regions.append(region)

        def leave(mod: nn.Module, args: Any, output: Any) -> Any:
            regions.pop().__exit__(None, None, None)
            return _to_float32(output)

        # Kept out of torch.compile's graphs: dynamo cannot carry an autocast region opened in
        # one hook and closed in another (it fails at the exit: "'autocast' object has no
        # attribute 'prev'"), so compiling the module ring.setup returned — DDP-wrapped, the
        # order torch recommends — broke. Run eagerly at the module's boundary, the hooks set
        # autocast around the compiled forward, whose graph is specialised to it (dynamo
        # guards on the autocast state). Costs about a microsecond per forward.
        module.register_forward_pre_hook(torch.compiler.disable(enter))
        module.register_forward_hook(torch.compiler.disable(leave), always_call=True)
        module._ringtrain_autocast = True

    def __repr__(self) -> str:
        return f"Precision({self.name!r}, {self.device_type})"
