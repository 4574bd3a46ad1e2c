"""The small contract every way of running implements.

A strategy is an object the user may build with its own options
(``rt.strategies.DDP(find_unused_parameters=True)``) and hand to ``Ring``. Its life:

1. ``__init__(**options)`` — validates its own options (nothing about the job yet);
2. ``attach(env, options)`` — the Ring tells it which process of which job it is, and how to
   join it (``parallel.group.GroupOptions``: device, backend, rendezvous, timeout, stall warning,
   the activity the watchdog reads); a strategy refuses a job it cannot run here;
3. ``configure(accumulate=, nonfinite=, sync_batchnorm=)`` — the Ring tells it how it will
   be driven; a strategy refuses what it cannot do (or adapts: Horovod's
   ``backward_passes_per_step``);
4. ``setup_environment()`` — claims the device, joins the process group;
5. ``setup_module`` / ``setup_optimizer`` / collectives / checkpoint hooks, while training;
6. ``teardown()`` — leaves the group, never waiting on peers.

Only what differs is abstract: the device and how the module is wrapped. Everything else
has a working default here, correct on one process. Optional abilities are mixins that
code asks for with ``isinstance`` (docs/architecture.md, principle 2) — never ``strategy.name == ...``.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from ..checkpoint import state
from ..checkpoint.state import gather_full, is_sharded, load_module_state
from ..errors import RingtrainError
from ..loop import collectives
from ..parallel.environments import Environment
from ..parallel.group import GroupOptions, ProcessGroup
from ..parallel.mesh import TP, Layout, build as build_mesh, data_layout
from ..parallel.stages import spans_devices
from .compiling import BlockTransforms
from .materialize import check as check_meta, materialize, on_meta, rank0_rng_state


class Strategy(ABC):
    """How one process of the job runs: device, wrapping, communication."""

    name: str = "base"
    # ring.setup(model, optimizer, **options): the keyword options this strategy understands.
    MODULE_OPTIONS: frozenset[str] = frozenset()
    # What wrap_module applies to the model's blocks (activation checkpointing, compile): nothing until the Ring
    # says (transform_blocks).
    blocks: BlockTransforms = BlockTransforms()
    # The job's DeviceMesh (parallel/mesh.py; ``ring.mesh``): a Distributed strategy's, once its group formed.
    mesh: Any = None

    def __init__(self) -> None:
        self.collectives = collectives.Collectives()  # the ring's own (Strategy.all_reduce & co.)
        self._env: Environment | None = None
        self.options = GroupOptions()  # how to join the job: the Ring's, once attached

    # --- joining a job ---------------------------------------------------------------
    def attach(self, env: Environment, options: GroupOptions | None = None, **asked: Any) -> "Strategy":
        """Make this strategy the one of process ``env`` (once); returns it. ``options`` say how to join the job
        (or ``asked``: ``GroupOptions.of``'s keywords, e.g. ``device="cpu"``)."""
        if self._env is not None:
            raise RingtrainError(
                f"this {type(self).__name__} strategy object already serves a Ring",
                "build a new strategy object for each Ring (rt.strategies.DDP(...) inside the function that makes it).",
            )
        self._env = env
        self.options = options if options is not None else GroupOptions.of(**asked)
        self.collectives.activity = self.options.activity
        self.check_job()
        self.join_job()
        return self

    @property
    def activity(self) -> Any:
        """What this process's main thread reports (liveness/activity.py): the options' (the Ring's)."""
        return self.options.activity

    @property
    def device_request(self) -> str:
        return self.options.device

    def check_job(self) -> None:
        """Refuse a job this strategy cannot run (called by ``attach``)."""

    def join_job(self) -> None:
        """Prepare to join the job (called by ``attach``, after ``check_job``): ``Distributed`` makes its
        process-group service here; it forms in ``setup_environment``."""

    def configure(self, *, accumulate: int = 1, nonfinite: str = "raise", sync_batchnorm: bool = False) -> None:
        """How the Ring will drive this strategy; refuse (RingtrainError) what it cannot do."""

    def transform_blocks(self, transforms: BlockTransforms) -> None:
        """``Ring(activation_checkpointing=, compile=)``: what ``wrap_module`` applies to the model's blocks, after
        any tensor-parallel cut and before the wrapper or shards (compiling.py has the order). A strategy that
        cannot run it refuses here, before the group forms."""
        self.blocks = transforms

    def accumulate_changed(self, accumulate: int, optimizers: list[torch.optim.Optimizer]) -> None:
        """``ring.accumulate`` was set before training began (after ``configure``; ``optimizers``: set up already)."""

    @property
    def env(self) -> Environment:
        if self._env is None:
            raise RingtrainError(f"the {type(self).__name__} strategy is not attached to a job yet",
                                 "pass it to rt.Ring(strategy=...), which attaches it.")
        return self._env

    # --- who and where ---------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def node_rank(self) -> int:
        return self.env.node_rank

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @property
    def devices_per_process(self) -> int:
        """How many devices one process drives (DataParallel drives several)."""
        return len(self.devices)

    @property
    def devices(self) -> list[torch.device]:
        """The devices this process computes on (DataParallel: its replicas' GPUs)."""
        return [self.device]

    def setup_environment(self) -> None:
        """Claim the device and join the process group (nothing to do on one process)."""

    def teardown(self, failure: BaseException | None = None) -> None:
        """Leave the process group; safe to call twice; never waits on peers.

        ``failure``: the exception on its way out, if any (the peers are told this rank failed)."""

    def finish(self, reason: str) -> None:
        """This rank ends on purpose before ``teardown`` (a preemption's checkpoint is written): the peers are told
        ``reason`` rather than that it failed (nobody to tell on one process)."""

    def enable_collective_checks(self, timeout: float) -> None:
        """Check every collective across ranks first (nothing to check on one process)."""

    @property
    def data_parallel_rank(self) -> int:
        """Which shard of the data this process reads (pipeline stages of one replica share one)."""
        return self.rank

    @property
    def data_parallel_size(self) -> int:
        """How many different shards the data is cut into."""
        return self.world_size

    @property
    def seed_rank(self) -> int:
        """Which random stream this process draws after ``ring.setup`` (the Ring seeds it with seed + seed_rank):
        its own, except where ranks compute one thing together (a tensor-parallel group's replicated activations)."""
        return self.rank

    # --- model and optimizer --------------------------------------------------------
    def setup_module(self, module: nn.Module, precision: Any, **options: Any) -> nn.Module:
        """Place ``module`` on the device, run its forward under ``precision``, wrap it.

        Moved before wrapping: DDP and DataParallel need the module on its device first. A
        model already spread over several devices (``rt.split``, or placed by hand) keeps its
        placement. ``options`` are ring.setup's keywords that this strategy understands.
        """
        if on_meta(module):
            # Built on the meta device: allocate it whole here, initialise it from rank 0's random state.
            check_meta(module)
            rng = rank0_rng_state(self.broadcast_object)
            module = module.to_empty(device=self.device)
            materialize(module, rng)
        elif not spans_devices(module):
            module = module.to(self.device)
        precision.wrap_forward(module)
        return self.wrap_module(module, **options)

    @abstractmethod
    def wrap_module(self, module: nn.Module, **options: Any) -> nn.Module:
        """Return ``module`` (already on ``self.device``) ready for training."""

    def unwrap(self, module: nn.Module) -> nn.Module:
        """The user's module inside any wrapper this strategy added."""
        return module

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, module: nn.Module) -> torch.optim.Optimizer:
        """The optimizer for ``module`` as this strategy runs it (the same one, by default)."""
        return optimizer

    def sync_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Make this step's gradients final now (before clipping); DDP's already are after backward."""

    def step_context(self, optimizer: torch.optim.Optimizer) -> ContextManager:
        """The context the optimizer's real step runs in."""
        return contextlib.nullcontext()

    def clip_grad_norm_(self, module: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip ``module``'s gradients by their total norm; return that norm."""
        return torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm, norm_type=norm_type)

    def check_same_model(self, model: nn.Module) -> None:
        """Every rank must hold the same architecture before DDP compares (or hangs on) it."""
        if self.world_size == 1:
            return
        mine = [(name, tuple(p.shape), str(p.dtype)) for name, p in model.named_parameters()]
        everyone = self.gather_object(mine)
        for rank, theirs in enumerate(everyone):
            if theirs == everyone[0]:
                continue
            first = next(
                (f"{a} on rank 0 vs {b} on rank {rank}" for a, b in zip(everyone[0], theirs) if a != b),
                f"rank 0 has {len(everyone[0])} parameters, rank {rank} has {len(theirs)}",
            )
            raise RingtrainError(
                f"rank {rank} set up a different model than rank 0: first difference: {first}",
                "build the same model (same code and constructor arguments) on every rank before ring.setup.",
            )

    # --- checkpoints: the user's unsplit, unwrapped state (state.py has the forms) -----------
    # A strategy whose checkpoints are sharded folders by default (ring.save, checkpoint_dir).
    shards_state = False

    def named_parameters(self, module: nn.Module) -> dict[str, nn.Parameter]:
        """This rank's parameters of ``module`` under the unsplit model's names (shards stay shards)."""
        return dict(self.unwrap(module).named_parameters())

    def local_state(self, module: nn.Module) -> dict[str, Any]:
        """The state this rank holds, under the unsplit model's names: whole tensors, or DTensor shards."""
        return self.unwrap(module).state_dict()

    def state_keys(self, module: nn.Module) -> set[str]:
        """Every key of the unsplit model's state dict (a pipeline rank holds only some of them)."""
        return set(self.local_state(module))

    def load_local_state(self, module: nn.Module, state_dict: dict[str, Any]) -> None:
        """Load tensors laid out as ``local_state`` gives them."""
        self.unwrap(module).load_state_dict(state_dict)

    def module_state(self, module: nn.Module) -> Any:
        """``module``'s whole state dict on the CPU, on rank 0 (None elsewhere). Collective for shards."""
        return gather_full(self.local_state(module), keep=self.rank == 0)

    def load_module_state(self, module: nn.Module, state_dict: Any, path: str) -> None:
        """Load a whole state dict (every rank holds it); shards take their part."""
        load_module_state(self.unwrap(module), state_dict, path)

    def optimizer_state(self, optimizer: torch.optim.Optimizer, module: nn.Module | None = None) -> Any:
        """``optimizer.state_dict()`` as the optimizer of the unsplit model would give it, on rank 0. Collective
        for shards (``module``: the model it was set up with)."""
        if module is None or not _holds_shards(optimizer):
            return optimizer.state_dict()
        named = state.named_optimizer(optimizer, state.parameter_names(self.named_parameters(module)))
        full = state.gather_full(named, keep=self.rank == 0)
        return state.optimizer_by_index(full) if full is not None else None

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state_dict: Any,
                             module: nn.Module | None = None) -> None:
        """Load a whole (numbered) optimizer state; shards take their part."""
        if module is None or not _holds_shards(optimizer):
            optimizer.load_state_dict(state_dict)
            return
        params = self.named_parameters(module)
        names = state.parameter_names(params)
        state.load_named_optimizer(optimizer, state.named_from_index(state_dict, optimizer, names), names, params)

    # --- gradient compression's state (DDP's PowerSGD): part of every checkpoint's meta ---------
    def comm_state(self) -> Any:
        """Collective where there is any: what continuing the gradient compression exactly needs."""
        return None

    def load_comm_state(self, saved: Any) -> None:
        """Continue from ``comm_state``'s result (a strategy without compression state ignores it)."""
        return None

    # --- communication: identity on one process (collectives.py, over comm/) ----------
    def all_reduce(self, x: Any, op: str = "mean") -> torch.Tensor:
        return self.collectives.all_reduce(x, op)

    def all_gather(self, x: Any) -> torch.Tensor:
        return self.collectives.all_gather(x)

    def reduce(self, x: Any, dst: int = 0, op: str = "mean") -> torch.Tensor | None:
        return self.collectives.reduce(x, dst, op)

    def gather(self, x: Any, dst: int = 0) -> torch.Tensor | None:
        return self.collectives.gather(x, dst)

    def gather_object(self, obj: Any) -> list[Any]:
        return self.collectives.gather_object(obj)

    def broadcast(self, x: Any, src: int = 0) -> torch.Tensor:
        return self.collectives.broadcast(x, src)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return self.collectives.broadcast_object(obj, src)

    def barrier(self) -> None:
        self.collectives.barrier()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _holds_shards(optimizer: torch.optim.Optimizer) -> bool:
    return any(is_sharded(p) for group in optimizer.param_groups for p in group["params"])


class Distributed(Strategy):
    """A strategy that runs on the job's process group (the service in parallel/group.py)."""

    # Does a backward pass wait for the other ranks (DDP's gradient all-reduce)? The watchdog
    # then counts a backward that does not return as a blocked collective.
    backward_syncs = False

    def __init__(self) -> None:
        super().__init__()
        self.group = None  # the ProcessGroup, made when the strategy is attached
        self.mesh = None  # the job's DeviceMesh (mesh.py), made when the group forms
        self._checkpoint_group = None

    def layout(self) -> Layout:
        """This strategy's mesh dimensions over the job's ranks (mesh.py); data parallel by default."""
        return Layout(data_layout(self.world_size))

    @property
    def data_parallel_rank(self) -> int:
        return self.layout().data_parallel_rank(self.rank)

    @property
    def data_parallel_size(self) -> int:
        return self.layout().data_parallel_size()

    @property
    def seed_rank(self) -> int:
        # The ranks of a TP group draw the same numbers: dropout on the activations they all hold must agree.
        return self.layout().rank_without(self.rank, TP)

    def checkpoint_group(self) -> Any:
        """A Gloo group of every rank for asynchronous checkpoint writes (made on first use: collective)."""
        if self._checkpoint_group is None:
            import torch.distributed as dist

            self._checkpoint_group = dist.new_group(backend="gloo")
        return self._checkpoint_group

    def join_job(self) -> None:
        self.group = ProcessGroup(self.env, self.options, backward_syncs=self.backward_syncs)

    @property
    def device(self) -> torch.device:
        return self.group.device

    @property
    def backend(self) -> str:
        return self.group.backend

    def setup_environment(self) -> None:
        self.group.form()
        self.mesh = build_mesh(self.layout(), self.device.type)

    def teardown(self, failure: BaseException | None = None) -> None:
        if self.group is not None:
            self.group.close(failure)

    def finish(self, reason: str) -> None:
        if self.group is not None and self.group.membership is not None:
            self.group.membership.finish(reason)

    def enable_collective_checks(self, timeout: float) -> None:
        self.collectives.enable_checks(self.group.check_store(), timeout)


class PipelineSchedule(ABC):
    """Mixin: the strategy runs forward and backward itself, micro-batch by micro-batch."""

    @abstractmethod
    def pipeline_step(self, x: Any, y: Any, loss_fn: Any, *, divisor: int = 1, sync: bool = True,
                      scaler: Any = None) -> torch.Tensor:
        """Forward and backward of one batch through the stages; its mean loss on every rank."""


class StageData(ABC):
    """Mixin: a data-parallel strategy a pipeline composes with (``Pipeline(data=...)``), applied to each stage on
    the stage's sub-mesh of D replicas (torchtitan's ``apply_*`` shape). Any strategy that implements it composes;
    the pipeline never asks which one it is."""

    shards_state = False  # the stage's parameters are shards (FSDP): checkpoints are sharded folders

    @abstractmethod
    def dims_over(self, replicas: int) -> tuple[tuple[str, int], ...]:
        """Its mesh dimensions over ``replicas`` ranks (mesh.py), outermost first; raise what does not divide."""

    @abstractmethod
    def place_stage(self, stage: nn.Module, *, mesh: Any, device: torch.device, precision: Any, meta: bool,
                    broadcast: Callable[[torch.Tensor], None]) -> None:
        """Put ``stage`` (in place) where this rank keeps it: on ``device``, sharded over ``mesh``, under
        ``precision``. ``meta``: built on the meta device (the pipeline initialises it afterwards);
        ``broadcast(tensor)`` gives a tensor the first replica's values on every replica."""

    @abstractmethod
    def run_stage(self, stage: nn.Module, *, mesh: Any, device: torch.device) -> nn.Module:
        """What the schedule runs for ``stage`` once every stage is initialised (e.g. wrapped in DDP)."""


class BackwardSyncControl:
    """Mixin: the strategy can skip gradient synchronisation for a backward pass."""

    def no_sync(self, module: nn.Module) -> ContextManager:
        return contextlib.nullcontext()
