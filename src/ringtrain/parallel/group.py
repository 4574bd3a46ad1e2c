"""The process-group service: what every multi-process strategy needs, in one place.

DDP, Horovod-style, pipeline and ``ringtrain.horovod`` all run on one default process
group; this object forms it and takes it down:

* the device and backend (devices.py: ``cuda:LOCAL_RANK`` or the CPU, NCCL beside Gloo);
* the rendezvous — the launcher's store (``env://``), ``tcp://`` or ``file://`` — kept so
  that debug checks and the liveness board can use it; a world of one needs no port at all
  (an in-process ``HashStore``);
* the cross-rank collective check (``Ring(debug_collectives=...)``);
* membership of the liveness board, with its watchdog (liveness/membership.py): a rank that fails
  or leaves while others wait for it ends the job in seconds, naming it;
* a teardown that never waits on peers: no barrier, and destroying the group is bounded.
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import tempfile
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.rendezvous import rendezvous

from ..errors import RingtrainError, one_line
from ..liveness import flight, membership as liveness
from ..liveness.activity import Activity
from ..liveness.board import BIND_WAIT_S
from ..liveness.seal import Seal
from ..liveness.watchdog import STALL_WARNING_S
from . import contract, devices
from .environments import Environment

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)  # torch.distributed's own default for Gloo and NCCL


def as_timeout(value: float | datetime.timedelta) -> datetime.timedelta:
    """``Ring(timeout=...)``: seconds or a timedelta."""
    if isinstance(value, datetime.timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise RingtrainError(f"Ring got timeout={value!r}", "pass a positive number of seconds or a datetime.timedelta.")
    return datetime.timedelta(seconds=float(value))


@dataclass(frozen=True)
class GroupOptions:
    """How this process joins its job, checked once (``of``) and then handed down as one object: the strategy,
    its process group, the liveness membership and its watchdog read what they need from it.

    ``activity`` is what the main thread reports (its phase, step, collectives); the one who made the options
    (a Ring, ``hvd.init()``) writes it, the watchdog reads it."""

    device: str = "auto"
    backend: str | None = None
    init_method: str | None = None
    timeout: datetime.timedelta = DEFAULT_TIMEOUT
    stall_warning: float | None = STALL_WARNING_S  # seconds in one collective before the stall report; None: never
    activity: Activity = field(default_factory=Activity, compare=False, repr=False)

    @classmethod
    def of(cls, *, device: str = "auto", backend: str | None = None, init_method: str | None = None,
           timeout: float | datetime.timedelta = DEFAULT_TIMEOUT, stall_warning: float | None | str = "default",
           activity: Activity | None = None) -> "GroupOptions":
        """Ring's arguments, each validated here: seconds or a timedelta; ``stall_warning="default"``: the
        launcher's (``RINGTRAIN_STALL_WARNING``, contract.override decides)."""
        devices.check_device_name(device)
        stall_warning = contract.override(contract.read(), stall_warning=stall_warning).stall_warning
        return cls(device, backend, init_method, as_timeout(timeout), stall_warning,
                   Activity() if activity is None else activity)
_formations = 0  # process groups this process has formed: part of the liveness board's generation


class ProcessGroup:
    """The job's default process group, as one rank sees it."""

    def __init__(self, env: Environment, options: GroupOptions | None = None, *, backward_syncs: bool = False,
                 gpus: devices.Gpus | None = None):
        options = GroupOptions() if options is None else options
        self.env = env
        self.options = options
        self.timeout = options.timeout
        self.init_method = options.init_method
        self.activity = options.activity
        self.backward_syncs = backward_syncs  # DDP: a blocked backward is a blocked collective
        device, backend = self._requested = (options.device, options.backend)
        self._gpus = devices.visible_gpus() if gpus is None else gpus
        devices.check_requested(device, self._gpus)
        self._device: torch.device | None = None
        if not devices.needs_peers(device, env.local_world_size, self._gpus):
            self._device = devices.choose_device(device, env.local_rank, env.local_world_size, self._gpus)
            self.backend = devices.choose_backend(self._device, backend)
        else:  # decided in form(), once the peers' GPUs are known; the backend is NCCL's then
            self.backend = devices.choose_backend(torch.device("cuda", 0), backend)
        self.store: dist.Store | None = None  # prefixed "ringtrain/": checks and the board live under it
        self.membership: liveness.Membership | None = None
        self._destroyed = False  # close() destroyed the group it formed, cleanly
        self._owns_group = False

    @property
    def device(self) -> torch.device:
        if self._device is None:
            raise RingtrainError("the device is chosen when the process group forms", "call form() first (Ring does).")
        return self._device

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    # --- forming ------------------------------------------------------------------
    def form(self) -> None:
        """Claim the device and join (or adopt) the default process group."""
        if dist.is_initialized():
            self._adopt()
            return
        global _formations
        raw = self._rendezvous()
        if self._device is None:
            self._device = devices.choose_device(self._requested[0], self.env.local_rank, self.env.local_world_size,
                                                 self._gpus, self._local_peers_gpus(raw))
        # Each process claims its own GPU before anything touches CUDA, or every rank's
        # context lands on cuda:0 (PyTorch DDP notes, "one GPU per process").
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)
        generation = f"{self.env.restart_count}-{_formations}"
        # NCCL's flight recorder: read by torch from the environment only, before the group forms (flight.py).
        settings = contract.read()
        os.environ.update(flight.settings(self.backend, os.environ, tempfile.gettempdir(),
                                          settings.run_id or str(os.getpid())))
        board = None
        if self.world_size > 1:
            board = liveness.Board(raw, self.rank, self.world_size, generation, Seal(settings.job_secret),
                                   agent=settings.agent_nonce, address=f"{self.env.master_addr}:{self.env.master_port}")
            board.hello()  # before the group forms: every peer's hello is there once it has
        try:
            # Each formation's keys under a prefix of their own: a group formed again on the same
            # store (ring.close() then a new Ring, hvd.shutdown() then hvd.init()) would otherwise
            # read the previous group's addresses and hang.
            dist.init_process_group(
                backend=self.backend, store=dist.PrefixStore(f"ringtrain/pg/{generation}", raw),
                world_size=self.world_size, rank=self.rank, timeout=self.timeout,
                **({"device_id": self._device} if self._device.type == "cuda" else {}),
            )
        except (RuntimeError, ValueError, TimeoutError, OSError) as e:
            raise self._formation_error(e) from e
        _formations += 1
        self._owns_group = True
        self.store = dist.PrefixStore(f"ringtrain/{generation}", raw)  # this formation's keys only
        if board is not None:
            # Every rank said hello (with a nonce of its own) before the group formed: the job's key, from all of
            # them, seals what this rank posts from now on, and a post copied from another job opens nowhere.
            board.bind(wait_s=BIND_WAIT_S)
            self.membership = liveness.Membership(board, self.activity, backward_syncs=self.backward_syncs,
                                                  error_file=self.env.error_file,
                                                  stall_warning=self.options.stall_warning,
                                                  note=flight.note(self.backend, os.environ),
                                                  preempt_signal=settings.preempt_signal,
                                                  under_agent=settings.run_id is not None)
            self.membership.start()
            atexit.register(self._at_exit)

    def _rendezvous(self) -> dist.Store:
        if self.world_size == 1 and self.init_method is None:
            return dist.HashStore()  # a group of one: nothing to meet, no port to take
        where = self.init_method or self.env.default_init_method()
        try:
            store, _, _ = next(rendezvous(where, self.rank, self.world_size, timeout=self.timeout))
        except (RuntimeError, ValueError, TimeoutError, OSError) as e:
            raise self._formation_error(e) from e
        store.set_timeout(self.timeout)
        return store

    def _local_peers_gpus(self, raw: dist.Store) -> list[list[str]]:
        """Every process of this node's GPU UUIDs, through the store (only when GPUs are fewer than processes)."""
        prefix = f"ringtrain/gpus/{self.env.restart_count}/{self.env.node_rank}"
        raw.set(f"{prefix}/{self.env.local_rank}", json.dumps(list(self._gpus.uuids())))
        keys = [f"{prefix}/{r}" for r in range(self.env.local_world_size)]
        return [json.loads(v) for v in raw.multi_get(keys)]

    def _adopt(self) -> None:
        """The script made the group itself (init_process_group before Ring): use it, leave it to its owner."""
        if dist.get_world_size() != self.world_size:
            raise RingtrainError(
                f"a process group of size {dist.get_world_size()} already exists, "
                f"but this ring expects world size {self.world_size}",
                "create the Ring before calling init_process_group yourself, or let the Ring create it.",
            )
        if self._device is None:
            self._device = torch.device("cuda", torch.cuda.current_device())
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)

    def _formation_error(self, e: BaseException) -> RingtrainError:
        seconds = int(self.timeout.total_seconds())
        first = str(e).splitlines()[0] if str(e) else ""
        where = self.init_method or self.env.default_init_method()
        return RingtrainError(
            f"rank {self.rank} of {self.world_size} could not form the process group at {where} "
            f"within {seconds}s ({type(e).__name__}: {first})",
            "check that every rank was started with the same world size and master address/port, that the "
            "master (rank 0) is running and reachable from this host, and that the port is not in use by "
            "another job; lower Ring(timeout=...) to fail faster.",
        )

    # --- checks -------------------------------------------------------------------
    def check_store(self) -> dist.Store:
        """Where debug collective checks exchange their descriptors (the rendezvous store)."""
        if self.store is None:
            raise RingtrainError(
                "debug_collectives needs the rendezvous store, but this ring joined a process group made elsewhere",
                "let the Ring create the process group (do not call init_process_group yourself).",
            )
        return self.store

    # --- leaving ------------------------------------------------------------------
    def close(self, failure: BaseException | None = None) -> None:
        """Leave the group: post "finished" (or "failed") for the peers, then destroy it. Never waits on peers.

        With ``failure`` (an exception on its way out) nothing is destroyed: the process is
        ending, and destroying a group with collectives in flight can only wait."""
        if self.membership is not None:
            if failure is not None:
                self.membership.fail(one_line(failure))
            else:
                self.membership.finish("ring.close")
        if failure is not None:
            self._owns_group = False
        if self._owns_group and dist.is_initialized():
            with liveness.bounded():  # a destroy that cannot finish ends the process instead of hanging it
                if "gloo" in self.backend:
                    # ~ProcessGroupGloo joins its worker threads with the GIL held, and a worker
                    # that just finished a collective may still need the GIL to drop a tensor
                    # (seen under gdb: thread::join vs decref_pyobject). Releasing the GIL for a
                    # moment lets it; should it not be enough, the bound above ends the process.
                    time.sleep(0.05)
                dist.destroy_process_group()
            self._destroyed = True
        self._owns_group = False
        self.store = None

    def _at_exit(self) -> None:
        # At interpreter exit nothing is destroyed (the process is ending; destroying could only
        # wait): the board says this rank left, and the rest of the exit is bounded — unless close()
        # destroyed the group: then no engine thread is left to wait on a peer.
        if self.membership is not None:
            self.membership.at_exit(bound=not self._destroyed)
