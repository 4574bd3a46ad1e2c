"""The plan checks itself on the real run: step 1's peak memory on rank 0 against the plan's for the running layout.

``Ring(plan=...)`` (a ``Plan``, a ``plan.json`` or the folder ``ringtrain plan`` wrote it in), or a ``plan.json`` in
the Ring's ``log_dir``, asks for it; without either the Ring holds ``NoCheck``, which does nothing. ``ring.setup``
calls ``before`` (the model as given) and ``watch`` (wrapped, with its optimizer); the loop's ``Step`` calls back
after each optimizer step, and the first real step ends the check: the measurement stops there, so later steps run
as they would without it.

What is measured on rank 0: on a GPU, ``torch.cuda.max_memory_allocated`` since ``before``; on the CPU, torch's memory
tracker — as the plan's accuracy tests measure the real run: ``MemTracker`` entered before the strategy wraps the
model (DDP's buckets are allocated then), ``FSDPMemTracker`` on FSDP's shards and their optimizer. Both only watch
(a dispatch mode that runs every op as it is): the training is the same with and without the check.

The plan's figure is the steady state's, with the optimizer's state held through forward and backward, which a
fresh run's step 1 has not made yet: so the peak before the optimizer's step plus the state that step made is
weighed too (the larger of that and the step's peak), which is what step 2 on would hold.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
from torch import nn

from ..errors import RingtrainError
from ..strategies import PipelineSchedule
from . import trace
from .devices import GiB
from .layouts import Layout
from .report import SCHEMA, Plan

TOLERANCE = 0.15  # of the measured peak: a difference over it is said
PLAN_FILE = "plan.json"
PATIENCE = 10  # optimizer steps the fp16 scaler may skip before the check gives up


class NoCheck:
    """No plan: nothing is measured, nothing is said."""

    def before(self, model: nn.Module) -> None: ...

    def watch(self, model: nn.Module, optimizer: Any) -> None: ...

    def close(self) -> None: ...


def of(plan: Any, log_dir: str | None, step: Any, strategy: Any, precision: str) -> "NoCheck | Check":
    """The check a Ring holds: ``plan`` (a Plan, a plan.json, a folder holding one), else ``log_dir``'s plan.json,
    else none (then no file is looked at unless ``log_dir`` is given)."""
    if plan is None and (not log_dir or not os.path.isfile(os.path.join(log_dir, PLAN_FILE))):
        return NoCheck()
    source = plan if plan is not None else os.path.join(log_dir, PLAN_FILE)  # type: ignore[arg-type]
    return Check(read(source), source if isinstance(source, (str, os.PathLike)) else "the plan given", step,
                 strategy, precision)


def read(plan: Any) -> dict[str, Any]:
    """``plan`` as the JSON's object (schema ``ringtrain.plan/1``), checked."""
    if isinstance(plan, Plan):
        return plan.to_json()
    if not isinstance(plan, (str, os.PathLike)):
        raise RingtrainError(f"Ring got plan={plan!r}", "give a Plan (rt.plan(...)), the path of a plan.json "
                             "`ringtrain plan` wrote, or the folder it wrote it in.")
    path = os.path.join(plan, PLAN_FILE) if os.path.isdir(plan) else os.fspath(plan)
    try:
        with open(path) as f:
            made = json.load(f)
    except (OSError, ValueError) as e:
        raise RingtrainError(f"Ring(plan=...): cannot read the plan {path!r} ({type(e).__name__}: {e})",
                             "give the plan.json `ringtrain plan` wrote (or its folder), or leave plan=None.") from e
    if not isinstance(made, dict) or made.get("schema") != SCHEMA or not isinstance(made.get("rows"), list):
        raise RingtrainError(f"{path!r} is not a plan of schema {SCHEMA!r}",
                             "write it again with `ringtrain plan ... script.py` (docs/plan.md has the schema).")
    return made


def mib(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if abs(n) >= GiB else f"{n / 2**20:.2f} MiB"


def state_bytes(optimizer: Any) -> int:
    """The bytes of this rank's optimizer state (a DTensor's local shard), each storage once."""
    seen: dict[int, int] = {}
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                local = value.to_local() if hasattr(value, "to_local") else value
                storage = local.untyped_storage()
                seen[storage.data_ptr() or id(storage)] = storage.nbytes()
    return sum(seen.values())


def running_layout(strategy: Any, model: nn.Module) -> Layout | None:
    """The plan's layout of what this Ring runs, or None where the plan has none (a pipeline, DataParallel,
    Horovod)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(strategy, PipelineSchedule):
        return None
    dims = dict(strategy.layout().dims) if hasattr(strategy, "layout") else {}
    checkpointing = strategy.blocks.checkpointing
    ac = checkpointing.mode if checkpointing is not None else "off"
    tp = dims.get("tp", 1)
    if isinstance(model, FSDPModule):
        return Layout("fsdp", dims.get("dp_replicate", 1), dims.get("dp_shard", 1), tp, ac,
                      getattr(strategy, "offload", None) == "cpu")
    if isinstance(model, DistributedDataParallel):
        return Layout("ddp", dims.get("dp_replicate", 1), tp=tp, ac=ac)
    if strategy.world_size == tp and strategy.devices_per_process == 1:
        return Layout("single", tp=tp, ac=ac)
    return None


class Check:
    """Step 1's peak on rank 0 against the plan's row for the running layout (see the module docstring)."""

    def __init__(self, plan: dict[str, Any], source: Any, step: Any, strategy: Any, precision: str):
        self.plan, self.source, self.step, self.strategy, self.precision = plan, source, step, strategy, precision
        self.tracker: Any = None
        self.state = "new"  # new -> setting up -> watching -> done
        self.handles: list[Any] = []
        self.before_step: int | None = None  # the peak when the optimizer's first step began
        self.state_before = self.state_after = 0  # the optimizer's state bytes before and after that step
        self.steps_seen = 0

    # --- measuring ----------------------------------------------------------------------------------------------
    @property
    def gpu(self) -> bool:
        return self.strategy.device.type == "cuda"

    def before(self, model: nn.Module) -> None:
        if self.state != "new":
            return  # a second model: the plan is of the first
        self.state = "setting up"
        if self.strategy.rank != 0:
            return
        if self.gpu:
            torch.cuda.reset_peak_memory_stats(self.strategy.device)
            return
        self.tracker = trace._trackers()[False]()
        self.tracker.track_external(model)
        self.tracker.__enter__()  # before the strategy wraps the model: DDP's buckets are allocated inside

    def watch(self, model: nn.Module, optimizer: Any) -> None:
        if self.state != "setting up":
            return
        self.state = "watching"
        if self.strategy.rank != 0:
            return self._stop()
        layout = running_layout(self.strategy, model)
        why = None if optimizer is not None else "ring.setup got no optimizer"
        why = why or (None if layout is not None else f"the plan has no layouts of {self.strategy!r}")
        if why is not None:
            print(f"ringtrain: plan check: step 1 is not checked against {self.source}: {why}", flush=True)
            return self._stop()
        self.layout, self.optimizer = layout, optimizer
        if self.tracker is not None:
            from torch.distributed.fsdp import FSDPModule

            if isinstance(model, FSDPModule):  # FSDP's own tracker, on its shards and their optimizer
                self.tracker.__exit__(None, None, None)
                self.tracker = trace._trackers()[True](model, optimizer)
                self.tracker.__enter__()
            else:
                self.tracker.track_external(optimizer)
        self.handles = [optimizer.register_step_pre_hook(self._step_begins),
                        optimizer.register_step_post_hook(self._step_made)]
        self.step.on_stepped(self._stepped)

    def _peak(self) -> int:
        if self.tracker is None:
            return torch.cuda.max_memory_allocated(self.strategy.device)
        return sum(dev["Total"] for dev in self.tracker.get_tracker_snapshot("peak").values())

    def _step_begins(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.before_step is None:
            self.before_step, self.state_before = self._peak(), state_bytes(optimizer)

    def _step_made(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.state_after:
            self.state_after = state_bytes(optimizer)

    def _stepped(self) -> None:
        """After an optimizer step (the loop's Step calls it): the first real one ends the check."""
        self.steps_seen += 1
        if self.before_step is None and self.steps_seen < PATIENCE:
            return  # the fp16 scaler skipped the step: the optimizer has not stepped yet
        peak = self._peak()
        if self.before_step is not None:
            peak = max(peak, self.before_step + max(self.state_after - self.state_before, 0))
        self._stop()
        if self.before_step is None:
            print(f"ringtrain: plan check: the optimizer took no step in {PATIENCE}; memory not checked", flush=True)
            return
        self.say(peak)

    def _stop(self) -> None:
        self.state = "done"
        for handle in self.handles:
            handle.remove()
        self.handles = []
        if self._stepped in self.step.stepped_hooks:
            self.step.stepped_hooks.remove(self._stepped)
        if self.tracker is not None:
            tracker, self.tracker = self.tracker, None
            tracker.__exit__(None, None, None)

    def close(self) -> None:
        if self.state != "done":
            self._stop()

    # --- saying it ----------------------------------------------------------------------------------------------
    def say(self, measured: int) -> None:
        name = self.layout.name
        row = next((r for r in self.plan["rows"] if r.get("layout") == name and not r.get("error")), None)
        how = "torch.cuda.max_memory_allocated" if self.gpu else "torch's memory tracker"
        if row is None:
            planned = ", ".join(r.get("layout", "?") for r in self.plan["rows"]) or "none"
            print(f"ringtrain: warning: plan check: step 1 peaked at {mib(measured)} on rank 0 ({how}), but the plan "
                  f"{self.source} has no row for the layout running, {name} (it has: {planned})\nHINT: plan this "
                  "run's world: `ringtrain plan --nproc-per-node N ... script.py`, with N the ranks it runs on.",
                  file=sys.stderr, flush=True)
            return
        predicted = int(row["peak"])
        off = (predicted - measured) / measured if measured else 0.0
        figures = (f"step 1 peaked at {mib(measured)} on rank 0 ({how}); the plan {self.source} predicted "
                   f"{mib(predicted)} for {name}")
        if abs(off) <= TOLERANCE:
            print(f"ringtrain: plan checked: {figures} ({100 * off:+.1f}%)", flush=True)
            return
        causes = []
        if self.plan.get("precision") not in (None, self.precision):
            causes.append(f"the plan was made for precision {self.plan['precision']}, this run uses {self.precision}")
        causes += ["a batch size or sequence length other than the one planned (the plan traced the first batch)",
                   "another model or optimizer than the one planned (a changed size, a frozen part)",
                   "tensors the script makes after ring.setup and holds through step 1 (they count on the CPU)"]
        if self.gpu:
            causes.append("the kernels' workspaces and the allocator's rounding, which a plan does not see")
        print(f"ringtrain: warning: plan check: {figures}: the plan is {100 * abs(off):.0f}% "
              f"{'over' if off > 0 else 'under'} what this run holds (more than {100 * TOLERANCE:.0f}% apart)."
              f"\nHINT: likely: {'; '.join(causes)}. Plan again on this run's script and arguments "
              "(`ringtrain plan ... script.py args`) before trusting the plan's other rows.",
              file=sys.stderr, flush=True)
