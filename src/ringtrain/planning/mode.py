"""Planning mode: the user's own script, run by ``ringtrain plan``, plans instead of training.

``ringtrain plan`` (cli/plan.py) writes what it was asked (``request.json``: the world, the device...) in its folder
and runs the script with that folder in ``RINGTRAIN_PLAN`` (parallel/contract.py). There, ``Ring(...)`` forms no
process group and claims no device (``Request.take``: one CPU process, no checkpoint folder, log or timeline), and
``ring.setup`` hands this module the real model and optimizer and returns them as they are, with a forward
pre-hook: the model's first call — on the first batch of the script's loader or of its ``ring.steps`` loop — is
what the plan traces (planning/__init__.py's ``plan``). The hook prints the table, writes ``plan.json``,
``plan.txt`` and ``plan.png`` in the folder and ends the script (exit 0) before the forward runs on real tensors.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from torch import nn

from ..errors import RingtrainError
from ..parallel import contract

REQUEST = "request.json"


@dataclass
class Request:
    """What ``ringtrain plan`` asks for (its flags), and the folder the plan goes to."""

    folder: str
    world_size: int = 1
    nnodes: int = 1
    device: str | None = None
    device_memory: str | None = None
    intra_gbps: float | None = None
    inter_gbps: float | None = None
    script_strategy: str | None = field(default=None)

    def write(self) -> str:
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, REQUEST)
        with open(path, "w") as f:
            json.dump(asdict(self), f, indent=2)
        return path

    def take(self, strategy: Any) -> str:
        """The strategy the script asked for is noted (the table names it); the Ring runs as one CPU process."""
        self.script_strategy = strategy if isinstance(strategy, str) else repr(strategy)
        return "single"

    def setup(self, model: nn.Module, optimizer: Any, scheduler: Any, precision: Any) -> Any:
        """``ring.setup``'s answer in planning mode: the same objects, the model's first call planned."""
        if optimizer is None:
            raise RingtrainError("ringtrain plan: ring.setup got a model without an optimizer",
                                 "pass the optimizer too (ring.setup(model, optimizer)): its state is a part of "
                                 "the memory a plan weighs.")

        def first_call(module: nn.Module, args: tuple, kwargs: dict) -> None:
            handle.remove()  # the plan's copies of the model must not plan again
            self.plan_and_exit(module, optimizer, args, kwargs, precision)

        handle = model.register_forward_pre_hook(first_call, with_kwargs=True)
        return (model, optimizer) + ((scheduler,) if scheduler is not None else ())

    def plan_and_exit(self, model: nn.Module, optimizer: Any, args: tuple, kwargs: dict, precision: Any) -> None:
        from . import plan  # the package's entry: it imports this module (a function-level import breaks the circle)

        batch = kwargs if kwargs and not args else args if len(args) != 1 else args[0]
        if kwargs and args:
            raise RingtrainError("ringtrain plan: the model was called with positional and keyword arguments",
                                 "call it with one or the other for planning (model(x) or model(**batch)).")
        made = plan(model, optimizer, batch, world_size=self.world_size, nnodes=self.nnodes, device=self.device,
                    device_memory=self.device_memory, precision=getattr(precision, "name", precision),
                    intra_gbps=self.intra_gbps, inter_gbps=self.inter_gbps, script_strategy=self.script_strategy)
        print(made.table(), flush=True)
        paths = made.save(self.folder)
        print(f"ringtrain plan: wrote {', '.join(paths)}", flush=True)
        sys.exit(0)


def request() -> Request | None:
    """The request of ``ringtrain plan`` when it runs this process, else None."""
    folder = contract.read().plan
    if folder is None:
        return None
    path = os.path.join(folder, REQUEST)
    try:
        with open(path) as f:
            return Request(**{**json.load(f), "folder": folder})
    except (OSError, ValueError, TypeError) as e:
        raise RingtrainError(f"RINGTRAIN_PLAN={folder!r} holds no readable {REQUEST} ({e})",
                             "run the script with `ringtrain plan script.py`, or unset RINGTRAIN_PLAN.") from e
